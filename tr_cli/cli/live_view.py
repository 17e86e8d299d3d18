"""Rich rendering of decode step events: the live panel under streamed text, and the stats line.

Model output and token labels always go into `rich.text.Text` / `rich.tree.Tree` objects, never
into markup strings: model text is full of `[` and would otherwise be read as markup.

The live view never makes the decoder wait for the terminal: `LiveView.push` only appends to a
buffer under a lock; a background thread writes the text and redraws the panel at a bounded rate.
"""

from __future__ import annotations

import threading
import time
import unicodedata
from collections.abc import Callable, Iterable

from rich.box import ROUNDED
from rich.cells import cell_len, get_character_cell_size
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.panel import Panel
from rich.segment import ControlType, Segment
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
RESIZE_SETTLE_SECONDS = 1.0  # the panel is left out until the terminal's size has not changed for this long

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


TAB_SIZE = 8


class WordWrap:
    """Streamed text as terminal lines broken at word boundaries. What `feed` returns can be
    written at once; only the word still being written is held back until it ends (at a space,
    a line end or a wide character, after which a line may break too), so that it can move to
    the next line whole. `column` is where the written text ends. Control characters are
    dropped: model text never moves the cursor."""

    def __init__(self) -> None:
        self.column = 0
        self.word = ""
        self._word_cells = 0

    def feed(self, text: str, width: int) -> str:
        out: list[str] = []
        for char in text:
            if char == "\n":
                out.append(self._place(width) + "\n")
                self.column = 0
            elif char in " \t":
                out.append(self._place(width))
                spaces = TAB_SIZE - self.column % TAB_SIZE if char == "\t" else 1
                if self.column + spaces > width:  # the line is full: the space becomes its end
                    out.append("\n")
                    self.column = 0
                else:
                    out.append(" " * spaces)
                    self.column += spaces
            elif unicodedata.category(char) == "Cc":
                continue
            elif get_character_cell_size(char) > 1:  # CJK and the like break anywhere
                out.append(self._place(width))
                self._hold(char)
                out.append(self._place(width))
            else:
                self._hold(char)
                if self._word_cells >= width:  # a word as long as a line: break it here
                    out.append(self._place(width))
        return "".join(out)

    def finish(self, width: int) -> str:
        """The held word, and a line end if the text does not end with one."""
        out = self._place(width)
        if self.column:
            out += "\n"
            self.column = 0
        return out

    def narrowed_to(self, width: int) -> str:
        """After the terminal changed width: a line end when the text's last line no longer fits
        (a terminal that reflows has split it, one that does not has cut it, and may have put
        the cursor on its last column: the text goes on under it in both), else nothing."""
        if self.column > width:
            self.column = 0
            return "\n"
        return ""

    def _hold(self, char: str) -> None:
        self.word += char
        self._word_cells += get_character_cell_size(char)

    def _place(self, width: int) -> str:
        word, cells = self.word, self._word_cells
        if not word:
            return ""
        self.word, self._word_cells = "", 0
        out = ""
        if self.column and self.column + cells > width:
            out = "\n"
            self.column = 0
        while self.column + cells > width:  # longer than a line: hard breaks
            cut, used = 0, 0
            while cut < len(word) and used + get_character_cell_size(word[cut]) <= width:
                used += get_character_cell_size(word[cut])
                cut += 1
            cut = max(cut, 1)
            out += word[:cut] + "\n"
            word, cells = word[cut:], cell_len(word[cut:])
            self.column = 0
        self.column += cells
        return out + word


# Sequences Rich has no Control for. As control segments Rich writes them as they are to a
# terminal and leaves them out of a recording (the control field only marks them as such).
ERASE_BELOW = "\x1b[J"  # from the cursor to the end of the screen
SAVE_CURSOR, RESTORE_CURSOR = "\x1b7", "\x1b8"
# Everything after the cursor: "erase below" from one cell on, then the rest of the cursor's row.
# tmux scrolls the whole screen into its history when "erase below" starts at the top left
# corner, where it puts the cursor when a narrowing pushed the text's line off the screen.
ERASE = SAVE_CURSOR + "\x1b[C" + ERASE_BELOW + RESTORE_CURSOR + "\x1b[K"
WRAP_OFF, WRAP_ON = "\x1b[?7l", "\x1b[?7h"
INDEX = "\x1bD"  # the cursor one row down, scrolling at the bottom; the column kept


def _codes(text: str) -> Segment:
    return Segment(text, None, [(ControlType.BELL,)])


class _Segments:
    def __init__(self, segments: Iterable[Segment]) -> None:
        self.segments = list(segments)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.segments


class LiveView:
    """Streamed text with a small panel for the latest step at the bottom of the screen,
    redrawn by a background thread.

    The text is written once, as ordinary output, where the cursor stays between frames; the
    panel is drawn below it with absolute moves and erased by "erase below the cursor". Nothing
    counts rows drawn earlier, so a resize can't make a redraw miss the panel or erase earlier
    output, whether the terminal reflows (tmux and most emulators: each line re-wrapped, the
    cursor carried with its text) or not (xterm: lines cut). Lines of the panel leave the last
    column free and are drawn with autowrap off, so a frame written just before the terminal
    narrowed takes the rows it was drawn for.

    Where the panel goes follows from what a reflowing terminal does when narrowing re-wraps
    lines into more rows: tmux keeps the bottom of the screen where it is (blank rows below the
    cursor too) and pushes the rows at the top into its scrollback, out of reach of any redraw.
    A panel just under text near the top of the screen was left there (issue 43). So the panel
    sits on the bottom rows, and is drawn only while the text's line has at least as many rows
    above it as the panel has (the rows it gains when the width halves: what is pushed out is
    then text, where it belongs). `cursor_position` asks the terminal where the cursor is, at
    the start and after each resize (a reflow moves it, up or down, or to the top left corner
    when it pushed the text's line out); None, or no answer: the panel is drawn anyway. The
    panel is also left out until the size has not changed for `settle_seconds`, so a window
    dragged narrower pays for one resize, not each.
    """

    def __init__(
        self,
        console: Console,
        labels: TokenLabels,
        stats: Callable[[], GenerationStats],
        mode: str = "path",
        refresh_per_second: float = REFRESH_PER_SECOND,
        settle_seconds: float = RESIZE_SETTLE_SECONDS,
        cursor_position: Callable[[], tuple[int, int] | None] | None = None,
    ) -> None:
        self.console = console
        self.labels = labels
        self.stats = stats
        self.mode = mode
        self.interval = 1.0 / refresh_per_second
        self.settle_seconds = settle_seconds
        self.tree_lines = max(6, min(console.height - 8, 24))
        self._lock = threading.Lock()
        self._incoming: list[str] = []
        self._event: StepEvent | None = None
        self._wrap = WordWrap()
        # A terminal that takes no escape sequences (the legacy Windows console) gets the text only.
        self._codes = not (console.legacy_windows or console.is_dumb_terminal)
        self._size: tuple[int, int] | None = None
        self._resized_at = float("-inf")
        self._ask_position = cursor_position
        self._row: int | None = None  # the text's last row on the screen, counted as it is written
        self._panel_drawn = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # Called by the decode loop: no terminal I/O here.
    def push(self, event: StepEvent, delta: str) -> None:
        with self._lock:
            if delta:
                self._incoming.append(delta)
            self._event = event

    def _panel_lines(self, width: int, height: int) -> list[list[Segment]]:
        """The panel's lines at `width`; none when there is no room for them under the text."""
        with self._lock:
            event = self._event
        if event is None or not self._codes:
            return []
        # At most half the screen, less a row: below the text's line with as many rows above it.
        tree_lines = max(1, min(self.tree_lines, (height - 1) // 2 - 2))
        panel = step_panel(event, self.stats(), self.labels, self.mode, tree_lines)
        lines = self.console.render_lines(panel, self.console.options.update(width=width, height=None), pad=False)
        room = height - 1 if self._row is None else min(height - 1, self._row)
        return lines if len(lines) <= room else []

    def frame(self, final: bool = False) -> list[Segment]:
        """What one redraw writes: the old panel erased, the new text, the panel under it (none when final)."""
        with self._lock:
            text = "".join(self._incoming)
            self._incoming.clear()
        width, height = self.console.width, self.console.height
        usable = max(width - 1, 1)
        segments = []
        line_end = ""
        resized = self._size is not None and (width, height) != self._size
        position = None
        if self._size is None or resized:
            # Asked before this frame writes anything: the cursor is at the end of the text.
            position = self._ask_position() if self._ask_position is not None else None
            self._row = None if position is None else position[0]
        if resized:
            self._resized_at = time.monotonic()
            if position is not None:  # the terminal's word: re-wrapped (tmux), cut (xterm), or pushed out
                self._wrap.column = position[1]
            line_end = self._wrap.narrowed_to(usable - 1 if position is not None else usable)
            if line_end:
                segments.append(Segment(line_end))
                position = None
                if self._row is not None:
                    self._row = min(height - 1, self._row + 1)
        self._size = (width, height)
        if self._codes:
            segments.append(_codes(ERASE))
        out = self._wrap.feed(text, usable)
        if final:
            out += self._wrap.finish(usable)
        if out:
            segments.append(Segment(out))
        if self._row is not None:
            self._row = min(height - 1, self._row + out.count("\n"))
        settled = time.monotonic() - self._resized_at >= self.settle_seconds
        lines = self._panel_lines(usable, height) if settled and not final else []
        if lines:
            rows = len(lines)
            # Room for the panel under the text (scrolling it up if need be), then the panel
            # on the bottom rows and the cursor back at the end of the text.
            segments.append(_codes(INDEX * rows + f"\x1b[{rows}A" + SAVE_CURSOR + WRAP_OFF))
            for row, line in enumerate(lines, start=height - rows + 1):
                segments.append(_codes(f"\x1b[{row};1H"))
                segments.extend(line)
            segments.append(_codes(WRAP_ON + RESTORE_CURSOR))
            self._panel_drawn = True
            if self._row is not None:
                self._row = min(self._row, height - 1 - rows)
        return segments

    def _write(self, segments: list[Segment]) -> None:
        if segments:
            self.console.print(_Segments(segments), end="", soft_wrap=True, crop=False)

    def _tick(self) -> None:
        self._write(self.frame())

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - a drawing problem must never take the reply down
                pass

    def __enter__(self) -> LiveView:
        self.console.show_cursor(False)
        self._thread = threading.Thread(target=self._run, name="tr-live-view", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if not self._panel_drawn:  # a reply over before the first redraw: its last step still shows
                self._write(self.frame())
            self._write(self.frame(final=True))
        finally:
            self.console.show_cursor(True)
