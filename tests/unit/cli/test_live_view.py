"""The live view (tr_cli/cli/live_view.py), rendered to a recording Rich console: the accepted path from the
root through the accepted drafts to the bonus token, rejected first-level alternatives, the whole
tree in tree mode, the stats line; model text such as `[bold]` or `[/]` is shown literally, never
read as markup; streamed text comes out in order, long lines broken at word boundaries; and in a
real terminal (tmux) resizes while a reply streams leave no panel behind and erase nothing."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from tr_cli.cli.live_view import (
    ACCEPTED_STYLE,
    BONUS_STYLE,
    ERASE,
    INDEX,
    REJECTED_STYLE,
    SAVE_CURSOR,
    LiveView,
    TokenLabels,
    WordWrap,
    path_lines,
    path_panel,
    stats_line,
    step_panel,
    tree_panel,
)
from tr_cli.core import GenerationStats, StepEvent, StepTimings, TreeSpec

ROOT = Path(__file__).resolve().parents[3]

PIECES = {
    10: "The",
    11: " quick",
    12: "[bold]",
    13: "[/]",
    14: " brown",
    15: " red",
    16: " fox",
    17: " jumps",
    18: "\n",
    19: "<|im_end|>",
    20: "\ufffd",
}


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(PIECES.get(i, f"<{i}>") for i in ids)

    def convert_ids_to_tokens(self, token_id):
        return "Ã©" if token_id == 20 else PIECES[token_id]


# Nodes: 1 [0], 2 [1], 3 [2], 4 [0,0], 5 [0,1], 6 [0,0,0]
TREE = TreeSpec.from_paths("small", [[0], [1], [2], [0, 0], [0, 1], [0, 0, 0]])


def event(accepted_nodes=(1, 4), bonus=17, step=3) -> StepEvent:
    tokens = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    accepted = [int(tokens[n]) for n in accepted_nodes]
    new = accepted + ([bonus] if bonus is not None else [])
    return StepEvent(
        step, tokens, TREE, list(accepted_nodes), accepted, bonus, new, StepTimings(0.001, 0.01, 0.001, 0.001), None
    )


def stats() -> GenerationStats:
    s = GenerationStats(prompt_tokens=12, new_tokens=9, steps=4, step_tokens=8, wall_seconds=0.5)
    return s


def render(renderable, width: int = 80) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None, highlight=False)
    console.print(renderable)
    return console.export_text()


def test_path_panel_shows_accepted_path_and_rejected_alternatives():
    text = render(path_panel(event(), stats(), TokenLabels(FakeTokenizer())))
    assert "The → ␣quick → ␣brown ⇒ ␣jumps" in text
    assert "rejected: [bold]  [/]" in text  # first-level nodes 2 and 3, literally
    assert "step 3 · accepted 2 · MAT 2.00 · 18.0 tok/s" in text
    assert len(text.rstrip("\n").splitlines()) == 4  # fixed height


def test_path_styles_and_no_markup():
    labels = TokenLabels(FakeTokenizer())
    path, rejected = path_lines(event(), labels)
    styles = {path.plain[span.start : span.end]: str(span.style) for span in path.spans}
    assert styles["␣quick"] == ACCEPTED_STYLE and styles["␣brown"] == ACCEPTED_STYLE
    assert styles["␣jumps"] == BONUS_STYLE
    rejected_styles = {rejected.plain[span.start : span.end]: str(span.style) for span in rejected.spans}
    assert rejected_styles["[bold]"] == REJECTED_STYLE and rejected_styles["[/]"] == REJECTED_STYLE


def test_no_draft_accepted_and_bonus_cut_by_a_stop():
    labels = TokenLabels(FakeTokenizer())
    text = render(path_panel(event(accepted_nodes=(), bonus=15), stats(), labels))
    assert "The ⇒ ␣red" in text
    assert "rejected: ␣quick  [bold]  [/]" in text  # all first-level nodes rejected
    text = render(path_panel(event(accepted_nodes=(1,), bonus=None), stats(), labels))
    assert "The → ␣quick" in text and "⇒" not in text.split("rejected")[0].split("│")[1]


def test_prefill_event():
    labels = TokenLabels(FakeTokenizer())
    prefill = StepEvent(0, None, None, [], [], 14, [14], StepTimings(forward=0.25), None)
    text = render(step_panel(prefill, stats(), labels, mode="tree"))
    assert "prefill · 12 tokens · 250 ms" in text and "first token ⇒ ␣brown" in text


def test_tree_panel_draws_whole_tree_with_accepted_path_first():
    labels = TokenLabels(FakeTokenizer())
    text = render(tree_panel(event(accepted_nodes=(3,), bonus=16), stats(), labels, lines=10))
    lines = text.splitlines()
    body = "\n".join(lines[1:-1])
    for label in ("The", "␣quick", "[bold]", "[/]", "␣brown", "␣red", "␣fox", "⇒ ␣fox"):
        assert label in body, label
    # Accepted node 3 ("[/]") comes first under the root, with the bonus under it.
    first = [line for line in lines if "[/]" in line or "␣quick" in line][0]
    assert "[/]" in first
    assert "␣quick → ␣brown" not in body  # ␣quick has two children, so no chain
    assert "␣brown → ␣fox" in body  # a single-child chain on one line
    assert len(lines) == 12  # fixed height: lines + borders


def test_tree_panel_is_cropped_to_its_height():
    labels = TokenLabels(FakeTokenizer())
    text = render(tree_panel(event(), stats(), labels, lines=3))
    assert "more lines" in text
    assert len(text.splitlines()) == 5


def test_token_labels():
    labels = TokenLabels(FakeTokenizer(), max_chars=6)
    assert labels(18) == "↵"
    assert labels(20) == "Ã©"  # an incomplete character: the raw piece
    assert labels(19) == "<|im_…"
    assert labels(11) == "␣quick"


def test_stats_line():
    s = stats()
    s.finish_reason = "interrupted"
    line = stats_line(s).plain
    assert line == "9 tokens · 18.0 tok/s · MAT 2.00 · 4 steps · interrupted"
    s.finish_reason, s.prefill_seconds, s.step_timings = "length", 0.05, StepTimings(forward=0.04)
    verbose = stats_line(s, verbose=True).plain
    assert "stopped at max_new_tokens" in verbose and "prefill 50 ms" in verbose and "forward 10.0" in verbose


def test_word_wrap_breaks_at_spaces_and_holds_the_word_being_written():
    wrap = WordWrap()
    assert wrap.feed("hello world again and", 12) == "hello world \nagain "
    assert wrap.word == "and" and wrap.column == 6  # shown once it ends: it may still move to the next line
    assert wrap.feed("roid\n", 12) + wrap.feed("x", 12) == "\nandroid\n"  # 6 + 7 cells do not fit
    assert wrap.finish(12) == "x\n" and wrap.column == 0
    wrap = WordWrap()
    assert wrap.feed("abcdefghijklmnop qr", 5) + wrap.finish(5) == "abcde\nfghij\nklmno\np qr\n"  # hard breaks
    wrap = WordWrap()
    assert wrap.feed("中文字符和日本語", 6) == "中文字\n符和日\n本語"  # wide characters: two cells, break anywhere
    wrap = WordWrap()
    assert wrap.feed("a\tb\x1b[2J\x07c \r", 40) == "a       b[2Jc "  # tabs to 8 columns, control characters dropped


def test_word_wrap_after_the_terminal_narrowed():
    wrap = WordWrap()
    wrap.feed("twenty cells of text ", 80)
    assert wrap.narrowed_to(40) == "" and wrap.column == 21  # still fits: the text goes on after it
    assert wrap.narrowed_to(15) == "\n" and wrap.column == 0  # re-wrapped or cut: go on under it


def raw(segments) -> str:
    return "".join(segment.text for segment in segments)


def test_live_view_push_never_writes_and_text_comes_out_in_order():
    file = io.StringIO()
    console = Console(file=file, width=31, height=20, force_terminal=True, color_system=None, record=True)
    view = LiveView(console, TokenLabels(FakeTokenizer()), stats)
    view.push(event(), "[bold]Hello[/bold] wor")
    view.push(event(), "ld\nsecond line, which is longer than thirty cells")
    assert file.getvalue() == ""  # the decode loop never waits for the terminal
    view._tick()
    view.push(event(), " end")
    view._tick()
    text = re.sub("╭.*?╯", "", console.export_text(), flags=re.S)  # the panels drawn after each frame's text
    assert text == "[bold]Hello[/bold] world\nsecond line, which is longer \nthan thirty cells "
    assert view._wrap.word == "end"


def test_live_view_session_prints_text_literally():
    file = io.StringIO()
    console = Console(file=file, width=60, height=20, force_terminal=True, color_system=None, record=True)
    with LiveView(console, TokenLabels(FakeTokenizer()), stats, refresh_per_second=50) as view:
        view.push(event(), "[bold]not bold[/bold] and [/] too\n")
        view.push(event(), "last line")
    text = re.sub("╭.*?╯", "", console.export_text(), flags=re.S)  # the panels drawn between the text
    assert text.index("[bold]not bold[/bold] and [/] too") < text.rindex("last line")
    assert text.rstrip().endswith("last line")


def test_a_frame_erases_below_the_text_and_draws_the_panel_on_the_bottom_rows():
    """Nothing is erased by counting rows: a terminal that reflows on resize (tmux) changes how many
    rows the panel takes, one that does not (xterm) keeps them, and a count right for one erased
    earlier output or left boxes in the scrollback of the other (issue 43)."""
    console = Console(file=io.StringIO(), width=40, height=20, force_terminal=True, color_system=None)
    view = LiveView(console, TokenLabels(FakeTokenizer()), stats, settle_seconds=0)
    view.push(event(), "Hello world")
    frame = raw(view.frame())
    assert ERASE == "\x1b7\x1b[C\x1b[J\x1b8\x1b[K"  # one cell on, then the line: tmux scrolls a clear from the corner
    assert frame.startswith(ERASE + "Hello ")
    assert INDEX * 4 + "\x1b[4A" + SAVE_CURSOR in frame  # room for the panel under the text, the cursor kept
    rows = re.findall(r"\x1b\[(\d+);1H([^\x1b]*)", frame)
    assert [int(row) for row, _ in rows] == [17, 18, 19, 20]  # the bottom rows, wherever the text is
    assert all(len(line) == 39 for _, line in rows)  # the last column free
    assert frame.endswith("\x1b8") and "\x1b[?7l" in frame  # autowrap off while drawing
    assert "\x1b[1A" not in frame  # no count of rows drawn before
    console.width = 6  # narrower than the line of text ("Hello "): go on under it; the panel at the new width
    frame = raw(view.frame())
    assert frame.startswith("\n" + ERASE)
    assert [len(line) for line in re.findall(r"\x1b\[\d+;1H([^\x1b]*)", frame)] == [5] * 4
    assert raw(view.frame(final=True)) == ERASE + "world\n"  # the held word; no panel, nothing else


def test_the_panel_waits_for_the_terminal_to_settle_and_fits_the_screen():
    console = Console(file=io.StringIO(), width=40, height=20, force_terminal=True, color_system=None)
    view = LiveView(console, TokenLabels(FakeTokenizer()), stats, mode="tree", settle_seconds=60)
    view.push(event(), "text ")
    assert ";1H" in raw(view.frame())  # first draw: no resize seen yet
    assert len(re.findall(r"\x1b\[\d+;1H", raw(view.frame()))) == 9  # tree panel: half the screen less a row
    console.height = 24  # a resize: nothing drawn under the text until it has settled
    assert ";1H" not in raw(view.frame())
    view.settle_seconds = 0
    console.height = 3  # settled, but no room for the panel (3 rows at least) under a line of text
    assert ";1H" not in raw(view.frame())


def test_the_panel_waits_for_rows_of_text_above_it():
    """A reflowing terminal (tmux) that narrows pushes the top rows of the screen into its
    scrollback, as many as the panel gains: they must be text. Where the cursor is, the terminal
    says, at the start and after each resize (a reflow moves it)."""
    console = Console(file=io.StringIO(), width=40, height=20, force_terminal=True, color_system=None)
    asked = []
    answers = iter([(1, 0), (0, 0), (6, 3)])

    def position():
        asked.append(console.width)
        return next(answers)

    view = LiveView(console, TokenLabels(FakeTokenizer()), stats, settle_seconds=0, cursor_position=position)
    view.push(event(), "one\ntwo\n")
    assert ";1H" not in raw(view.frame())  # rows 1 and 2 of text: fewer than the panel's 4
    view.push(event(), "three\nfour\n")
    assert ";1H" in raw(view.frame())  # the text's line on row 5 now
    console.width = 30
    view.push(event(), "five\n")
    assert ";1H" not in raw(view.frame())  # the terminal says row 0: the reflow moved the text up
    console.width = 35
    assert ";1H" in raw(view.frame()) and asked == [40, 30, 35]  # row 6: room again; asked once per size


needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux, a terminal that reflows on resize")


def stream_in_tmux(tmp_path, screen: str, earlier: int, settle: float) -> tuple[list[str], int]:
    """Run live_view_in_tmux.py in a tmux pane on a server of its own; the pane's whole text with
    its scrollback, and how many words were streamed."""
    done = tmp_path / "done"
    server = ["tmux", "-S", str(tmp_path / "tmux"), "-f", os.devnull]  # its socket goes with tmp_path
    # COLUMNS and LINES would pin Rich's size (the test runner may set them): the pane's is wanted.
    script = Path(__file__).with_name("live_view_in_tmux.py")
    command = f"env -u COLUMNS -u LINES {sys.executable} {script} {ROOT} {done} {screen} {earlier} {settle}"
    subprocess.run([*server, "new-session", "-d", "-x", "120", "-y", "30", command], check=True)
    try:
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        capture = subprocess.run([*server, "capture-pane", "-p", "-S", "-", "-E", "-"], capture_output=True, text=True)
    finally:
        subprocess.run([*server, "kill-server"], capture_output=True)
    assert done.exists(), capture.stdout
    return capture.stdout.rstrip("\n").split("\n"), int(done.read_text())


@pytest.mark.slow
@needs_tmux
@pytest.mark.parametrize(
    ("screen", "earlier"),
    [
        ("normal", 40),  # reflowed (tmux's screen), the text at the bottom
        ("normal", 0),  # reflowed, the text at the top of an empty screen
        ("alternate", 5),  # not reflowed (tmux's alternate screen, as xterm): lines cut, not re-wrapped
    ],
)
def test_resizes_while_a_reply_streams_leave_no_panel_and_keep_earlier_output(tmp_path, screen, earlier):
    """In a real terminal the pane goes narrower and wider, between known frames and then racing
    frames drawn every 5 ms (a panel at every frame: no settling). Before: tmux's scrollback
    kept the old panels' borders and lines (it pushes the top rows of the screen into its history
    when narrowing re-wraps lines, out of reach of any redraw) and partial lines twice, and a
    terminal that does not reflow lost earlier rows. About 3 s each (tmux, a Python start)."""
    lines, words = stream_in_tmux(tmp_path, screen, earlier, settle=0.0)
    text = "\n".join(lines)
    assert not set(text) & set("╭╮╰╯│"), text  # no row of a panel anywhere
    assert [line for line in lines if line.startswith("EARLIER")] == [
        f"EARLIER line {i} " + "e" * 60 for i in range(earlier)
    ], text
    assert re.findall(r"\bw(\d+)", text) == [str(i) for i in range(words)], text  # every word once, in order
    start, race, end = lines.index("START"), lines.index("RACE"), lines.index(f"END {words}")
    # No blank row in the reply either; but while tmux has not told the program its size yet, an
    # almost empty screen may push a blank row of the gap above the panel into the scrollback.
    reply = lines[start + 1 : race] + (lines[race + 1 : end] if earlier > 25 else [])
    assert all(line.strip() for line in reply), text
