"""Rich rendering of decode step events: the live panel under streamed text, and the stats line.

Model output and token labels always go into `rich.text.Text` / `rich.tree.Tree` objects, never
into markup strings: model text is full of `[` and would otherwise be read as markup.

The live view never makes the decoder wait for the terminal: `LiveView.push` only appends to a
buffer under a lock; a background thread prints finished lines and redraws the panel at a bounded
rate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rich.box import ROUNDED
from rich.cells import cell_len, get_character_cell_size
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.control import Control
from rich.live import Live
from rich.live_render import LiveRender
from rich.panel import Panel
from rich.segment import Segment
from rich.text import Text
from rich.tree import Tree

from ..core import GenerationStats, StepEvent

ROOT_STYLE = "bold"
ACCEPTED_STYLE = "bold green"
BONUS_STYLE = "bold cyan"
REJECTED_STYLE = "dim"
LABEL_MAX = 16
PATH_PANEL_HEIGHT = 4  # border, path line, rejected line, border
REFRESH_PER_SECOND = 8.0

_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


class TokenLabels:
    """Short printable labels of token ids: whitespace made visible, special tokens by name."""

    def __init__(self, tokenizer, max_chars: int = LABEL_MAX) -> None:
        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        token_id = int(token_id)
        label = self._cache.get(token_id)
        if label is None:
            label = self._cache[token_id] = self._make(token_id)
        return label

    def _make(self, token_id: int) -> str:
        try:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        except Exception:  # noqa: BLE001 - a label must never take the reply down
            text = ""
        if not text or "\ufffd" in text:  # a byte of a multi-byte character: show the raw piece
            try:
                text = str(self.tokenizer.convert_ids_to_tokens(token_id))
            except Exception:  # noqa: BLE001 - as above
                text = f"#{token_id}"
        out = "".join(_VISIBLE.get(c, c if c.isprintable() else repr(c)[1:-1]) for c in text)
        if len(out) > self.max_chars:
            out = out[: self.max_chars - 1] + "…"
        return out


def _title(event: StepEvent, stats: GenerationStats) -> Text:
    if event.step == 0:
        return Text(f"prefill · {stats.prompt_tokens} tokens · {event.timings.total * 1e3:.0f} ms", style="dim")
    return Text(
        f"step {event.step} · accepted {len(event.accepted_tokens)} · MAT {stats.mean_accepted_tokens:.2f} · "
        f"{stats.tokens_per_second:.1f} tok/s",
        style="dim",
    )


def path_lines(event: StepEvent, labels: TokenLabels) -> tuple[Text, Text]:
    """The accepted path from the root through the accepted drafts to the bonus token, and the
    rejected first-level alternatives."""
    path = Text(no_wrap=True, overflow="ellipsis")
    rejected = Text(no_wrap=True, overflow="ellipsis")
    if event.tree is None or event.tree_tokens is None:  # the prefill: no tree, one token
        path.append("first token ", style="dim")
        path.append("⇒ ", style="dim")
        path.append(labels(event.new_tokens[0]), style=BONUS_STYLE)
        rejected.append("no draft at the prefill", style="dim")
        return path, rejected
    tokens = event.tree_tokens.tolist()
    path.append(labels(tokens[0]), style=ROOT_STYLE)
    for token in event.accepted_tokens:
        path.append(" → ", style="dim")
        path.append(labels(token), style=ACCEPTED_STYLE)
    if event.bonus is not None:
        path.append(" ⇒ ", style="dim")
        path.append(labels(event.bonus), style=BONUS_STYLE)
    taken = event.accepted_nodes[0] if event.accepted_nodes else None
    others = [i for i in event.tree.children[0] if i != taken]
    rejected.append("rejected: ", style="dim")
    for n, node in enumerate(others):
        if n:
            rejected.append("  ")
        rejected.append(labels(tokens[node]), style=REJECTED_STYLE)
    if not others:
        rejected.append("none", style="dim")
    return path, rejected


def path_panel(event: StepEvent, stats: GenerationStats, labels: TokenLabels) -> Panel:
    path, rejected = path_lines(event, labels)
    return Panel(
        Group(path, rejected),
        title=_title(event, stats),
        title_align="left",
        box=ROUNDED,
        border_style="dim",
        height=PATH_PANEL_HEIGHT,
    )


def tree_renderable(event: StepEvent, labels: TokenLabels) -> Tree:
    """The whole draft tree of a step, accepted path first and highlighted, the bonus token under
    the last accepted node. Chains of single children share one line; leaf siblings share one line."""
    tokens = event.tree_tokens.tolist()
    children = event.tree.children
    accepted = set(event.accepted_nodes)
    last = event.accepted_nodes[-1] if event.accepted_nodes else 0

    def style(node: int) -> str:
        if node == 0:
            return ROOT_STYLE
        return ACCEPTED_STYLE if node in accepted else REJECTED_STYLE

    def label_chain(node: int) -> tuple[Text, int]:
        """Label of node and of its single-child descendants; returns the last node of the chain."""
        text = Text(labels(tokens[node]), style=style(node))
        while True:
            kids = children[node]
            if node == last and event.bonus is not None:
                return text, node
            if len(kids) != 1:
                return text, node
            node = kids[0]
            text.append(" → ", style="dim")
            text.append(labels(tokens[node]), style=style(node))

    def add(branch: Tree, node: int) -> None:
        kids = sorted(children[node], key=lambda c: c not in accepted)
        if node == last and event.bonus is not None:
            bonus = Text("⇒ ", style="dim")
            bonus.append(labels(event.bonus), style=BONUS_STYLE)
            branch.add(bonus)
        leaves = [c for c in kids if not children[c] and not (c == last and event.bonus is not None)]
        for kid in kids:
            if kid in leaves:
                continue
            text, end = label_chain(kid)
            add(branch.add(text), end)
        if leaves:
            row = Text(no_wrap=True, overflow="ellipsis")
            for n, leaf in enumerate(leaves):
                if n:
                    row.append("  ")
                row.append(labels(tokens[leaf]), style=style(leaf))
            branch.add(row)

    root_text, end = Text(labels(tokens[0]), style=ROOT_STYLE), 0
    tree = Tree(root_text, guide_style="dim")
    add(tree, end)
    return tree


class _Cropped:
    """A renderable cut to at most `lines` lines, the last one saying how many were left out."""

    def __init__(self, renderable, lines: int) -> None:
        self.renderable = renderable
        self.lines = max(1, lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        rendered = console.render_lines(self.renderable, options.update(height=None), pad=False)
        if len(rendered) > self.lines:
            hidden = len(rendered) - self.lines + 1
            rendered = rendered[: self.lines - 1] + [[Segment(f"… {hidden} more lines", console.get_style("dim"))]]
        for line in rendered:
            yield from line
            yield Segment.line()


def tree_panel(event: StepEvent, stats: GenerationStats, labels: TokenLabels, lines: int = 20) -> Panel:
    """`--live tree`: the draft tree of the step in a panel of fixed height (lines + borders)."""
    if event.tree is None:
        path, rejected = path_lines(event, labels)
        body = Group(path, rejected)
    else:
        body = _Cropped(tree_renderable(event, labels), lines)
    return Panel(
        body, title=_title(event, stats), title_align="left", box=ROUNDED, border_style="dim", height=lines + 2
    )


def step_panel(
    event: StepEvent, stats: GenerationStats, labels: TokenLabels, mode: str = "path", tree_lines: int = 20
) -> Panel:
    if mode == "tree":
        return tree_panel(event, stats, labels, tree_lines)
    return path_panel(event, stats, labels)


def stats_line(stats: GenerationStats, verbose: bool = False) -> Text:
    """The dim line after each reply."""
    parts = [
        f"{stats.new_tokens} tokens",
        f"{stats.tokens_per_second:.1f} tok/s",
        f"MAT {stats.mean_accepted_tokens:.2f}",
        f"{stats.steps} steps",
    ]
    if stats.finish_reason == "interrupted":
        parts.append("interrupted")
    elif stats.finish_reason == "length":
        parts.append("stopped at max_new_tokens")
    if verbose:
        parts.append(f"prompt {stats.prompt_tokens} tokens, prefill {stats.prefill_seconds * 1e3:.0f} ms")
        parts.append(step_split(stats))
    return Text(" · ".join(parts), style="dim")


def step_split(stats: GenerationStats) -> str:
    """Where a step's time goes: 'per step: draft 0.3 / forward 45.1 / verify 1.2 / update 0.9 ms'."""
    ms = stats.step_timings.ms_per_step(stats.steps)
    return "per step: " + " / ".join(f"{name} {value:.1f}" for name, value in ms.items()) + " ms"


def split_at_width(text: str, width: int) -> int:
    """Where to break `text` so the first part fits `width` cells: after the last space that fits,
    else (one long word) at the width itself. Returns len(text) when it all fits."""
    if cell_len(text) <= width:
        return len(text)
    used = 0
    cut = 0
    for i, char in enumerate(text):
        used += get_character_cell_size(char)
        if used > width:
            cut = i
            break
    space = text.rfind(" ", 0, cut + 1)
    return space + 1 if space > 0 else max(cut, 1)


class _ReflowingRender(LiveRender):
    """Rich's live region, erased whole after the terminal narrowed. A terminal that reflows on
    resize (tmux, VTE, iTerm2, kitty, Windows Terminal) re-wraps each drawn line into more rows;
    Rich moves up only as many rows as it drew, so every narrowing left the top of the old panel
    in the scrollback. Here each drawn line's width is kept, and the rows to erase are counted at
    the terminal's width now. (A terminal that does not reflow, as xterm, loses as many rows of
    earlier output from the screen instead, only when it narrows mid-reply.)"""

    def __init__(self, console: Console, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._console = console
        self._widths: list[int] = []
        self._drawn_width = 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        segments = list(super().__rich_console__(console, options))
        self._widths = [Segment.get_line_length(line) for line in Segment.split_lines(segments)]
        self._drawn_width = options.max_width
        yield from segments

    def rows_now(self) -> int:
        """The rows the last render takes on the terminal as wide as it is now."""
        if self._shape is None:
            return 0
        width = self._console.width
        if width >= self._drawn_width or width < 1:
            return self._shape[1]
        return sum(max(1, -(-line // width)) for line in self._widths)

    def position_cursor(self) -> Control:
        return self._erasing(super().position_cursor)

    def restore_cursor(self) -> Control:
        return self._erasing(super().restore_cursor)

    def _erasing(self, controls) -> Control:
        if self._shape is None:
            return controls()
        shape = self._shape
        self._shape = (shape[0], self.rows_now())
        try:
            return controls()
        finally:
            self._shape = shape


class LiveView:
    """Streamed text above a small panel for the latest step, redrawn by a background thread.

    Finished lines are printed normally (they scroll up as ordinary terminal output); the line
    being written and the panel live in a transient Rich `Live` region that is erased when the
    reply ends, so the prompt and the live view never overlap.
    """

    def __init__(
        self,
        console: Console,
        labels: TokenLabels,
        stats: Callable[[], GenerationStats],
        mode: str = "path",
        refresh_per_second: float = REFRESH_PER_SECOND,
    ) -> None:
        self.console = console
        self.labels = labels
        self.stats = stats
        self.mode = mode
        self.interval = 1.0 / refresh_per_second
        self.tree_lines = max(6, min(console.height - 8, 24))
        self._lock = threading.Lock()
        self._incoming: list[str] = []
        self._event: StepEvent | None = None
        self._partial = ""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None

    # Called by the decode loop: no terminal I/O here.
    def push(self, event: StepEvent, delta: str) -> None:
        with self._lock:
            if delta:
                self._incoming.append(delta)
            self._event = event

    def _render(self):
        with self._lock:
            event, partial = self._event, self._partial
        parts = [Text(partial, no_wrap=True, overflow="crop")] if partial else []
        if event is not None:
            parts.append(step_panel(event, self.stats(), self.labels, self.mode, self.tree_lines))
        return Group(*parts)

    def _take_lines(self) -> list[str]:
        """Move finished (and over-wide) lines out of the buffer."""
        with self._lock:
            text = self._partial + "".join(self._incoming)
            self._incoming.clear()
        *lines, partial = text.split("\n")
        width = max(self.console.width - 1, 10)
        while cell_len(partial) > width:
            cut = split_at_width(partial, width)
            lines.append(partial[:cut].rstrip(" "))
            partial = partial[cut:]
        with self._lock:
            self._partial = partial
        return lines

    def _tick(self) -> None:
        lines = self._take_lines()
        if lines:
            self.console.print(Text("\n".join(lines)), soft_wrap=True)
        self._live.refresh()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - a drawing problem must never take the reply down
                pass

    def __enter__(self) -> LiveView:
        self._live = Live(
            console=self.console,
            get_renderable=self._render,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
            vertical_overflow="crop",
        )
        # Rich's own region object, replaced before the first draw (Live has no hook for it).
        self._live._live_render = _ReflowingRender(
            self.console, self._live._live_render.renderable, vertical_overflow="crop"
        )
        self._live.start()
        self._thread = threading.Thread(target=self._run, name="tr-live-view", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        try:
            lines = self._take_lines()
            if lines:
                self.console.print(Text("\n".join(lines)), soft_wrap=True)
        finally:
            self._live.stop()
        if self._partial:
            self.console.print(Text(self._partial), soft_wrap=True)
