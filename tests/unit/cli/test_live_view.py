"""The live view (tr_cli/cli/live_view.py), rendered to a recording Rich console: the accepted path from the
root through the accepted drafts to the bonus token, rejected first-level alternatives, the whole
tree in tree mode, the stats line; model text such as `[bold]` or `[/]` is shown literally, never
read as markup; streamed text comes out in order, long lines broken at word boundaries."""

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
    REJECTED_STYLE,
    LiveView,
    TokenLabels,
    path_lines,
    path_panel,
    split_at_width,
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


def test_split_at_width():
    assert split_at_width("short", 10) == 5
    assert split_at_width("hello world again", 12) == 12  # after "hello world "
    assert split_at_width("abcdefghijkl", 5) == 5  # one long word: hard break
    assert split_at_width("中文字符和日本語", 6) == 3  # wide characters take two cells


def test_live_view_push_never_writes_and_lines_come_out_in_order():
    file = io.StringIO()
    console = Console(file=file, width=30, height=20, force_terminal=True, color_system=None, record=True)
    view = LiveView(console, TokenLabels(FakeTokenizer()), stats)
    view.push(event(), "[bold]Hello[/bold] wor")
    view.push(event(), "ld\nsecond line, which is longer than thirty cells")
    assert file.getvalue() == ""  # the decode loop never waits for the terminal
    lines = view._take_lines()
    assert lines == ["[bold]Hello[/bold] world", "second line, which is longer"]
    assert view._partial == "than thirty cells"


def test_live_view_session_prints_text_literally():
    file = io.StringIO()
    console = Console(file=file, width=60, height=20, force_terminal=True, color_system=None, record=True)
    with LiveView(console, TokenLabels(FakeTokenizer()), stats, refresh_per_second=50) as view:
        view.push(event(), "[bold]not bold[/bold] and [/] too\n")
        view.push(event(), "last line")
    text = console.export_text()
    assert text.index("[bold]not bold[/bold] and [/] too") < text.rindex("last line")
    assert text.rstrip().endswith("last line")


def test_the_live_region_is_erased_whole_after_the_terminal_narrows():
    """A terminal that reflows re-wraps each drawn line into more rows when it narrows: erasing as
    many rows as Rich drew left the top of the old panel in the scrollback (tmux, below)."""
    file = io.StringIO()
    console = Console(file=file, width=100, height=30, force_terminal=True, color_system=None)
    view = LiveView(console, TokenLabels(FakeTokenizer()), stats, refresh_per_second=50)
    with view:
        view.push(event(), "partial line")
        view._tick()
        region = view._live._live_render
        assert region.rows_now() == 5  # the partial line and a panel of 4 lines, at the width drawn
        console.width = 40  # the 100-cell panel lines now take 3 rows each, the 12-cell line 1
        assert region.rows_now() == 1 + 4 * 3
        ups = str(region.position_cursor()).count("\x1b[1A")
        assert ups == 12  # from the last row up to the first of the 13 it takes now
        console.width = 120  # wider: nothing re-wraps
        assert region.rows_now() == 5


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a terminal that reflows on resize")
def test_no_stale_panel_in_the_scrollback_after_resizes_in_tmux(tmp_path):
    script = tmp_path / "stream.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from types import SimpleNamespace\n"
        "from rich.console import Console\n"
        "from tr_cli.cli.live_view import LiveView\n"
        "from tr_cli.core import GenerationStats\n"
        "stats = GenerationStats(prompt_tokens=5)\n"
        "step = SimpleNamespace(step=0, timings=SimpleNamespace(total=0.01), new_tokens=[1], tree=None,"
        " tree_tokens=None)\n"
        "print('START', flush=True)\n"
        "with LiveView(Console(), lambda t: f'tok{t}', lambda: stats) as view:\n"
        "    for i in range(45):\n"
        "        view.push(step, f'word{i} ' * 3 + ('\\n' if i % 3 == 2 else ''))\n"
        "        time.sleep(0.1)\n"
        "print('END', flush=True)\n"
        "time.sleep(60)\n"
    )
    session = f"tr-live-{os.getpid()}"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout

    # COLUMNS and LINES would pin Rich's width (the test runner may set them): the terminal's is wanted.
    command = f"env -u COLUMNS -u LINES {sys.executable} {script}"
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "30", command)
    try:
        deadline = time.monotonic() + 120
        while "START" not in tmux("capture-pane", "-t", session, "-p") and time.monotonic() < deadline:
            time.sleep(0.2)
        for width in ("100", "80", "60", "45", "110"):  # four narrowings, then wider
            time.sleep(0.5)
            tmux("resize-window", "-t", session, "-x", width, "-y", "30")
        while "END" not in tmux("capture-pane", "-t", session, "-p") and time.monotonic() < deadline:
            time.sleep(0.2)
        screen = tmux("capture-pane", "-t", session, "-p", "-S", "-")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert "END" in screen
    # Each narrowing left the top of the old panel behind (its border and first line). Known left:
    # now and then one row of a top border, at most one per narrowing (see the report in git log).
    assert "│" not in screen and "╰" not in screen and screen.count("╭") <= 4, screen
    assert set(re.findall(r"word\d+", screen)) == {f"word{i}" for i in range(45)}, screen
