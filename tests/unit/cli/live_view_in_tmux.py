"""Run inside a tmux pane by test_live_view.py: earlier output, then a reply streamed through
LiveView while the pane is resized, narrower and wider, from inside (so each resize lands
between two known frames), then a second part where resizes race a fast redraw (tmux tells
the program its new size up to 250 ms after it resized the pane, when resizes come fast).

usage: live_view_in_tmux.py ROOT DONE_FILE {normal,alternate} EARLIER_LINES SETTLE_SECONDS
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

root, done_file, screen = sys.argv[1:4]
earlier, settle = int(sys.argv[4]), float(sys.argv[5])
sys.path.insert(0, root)

from rich.console import Console  # noqa: E402

from tr_cli.cli.cursor_position import cursor_position  # noqa: E402
from tr_cli.cli.live_view import LiveView  # noqa: E402
from tr_cli.core import GenerationStats  # noqa: E402

STEPS = [(100, 30), (80, 30), (60, 30), (45, 30), (110, 30), (70, 24), (40, 30), (120, 30)]
RACE = [90, 50, 75, 35, 100, 55, 120]
stats = GenerationStats(prompt_tokens=5)
prefill = SimpleNamespace(step=0, timings=SimpleNamespace(total=0.01), new_tokens=[1], tree=None, tree_tokens=None)


def resize(width: int, height: int, wait: bool = True) -> None:
    subprocess.run(["tmux", "resize-window", "-x", str(width), "-y", str(height)], check=True)
    deadline = time.monotonic() + 5
    while wait and tuple(os.get_terminal_size(sys.stdout.fileno())) != (width, height):
        if time.monotonic() > deadline:
            raise SystemExit(f"the pane never became {width}x{height}")
        time.sleep(0.01)


def words(start: int, count: int) -> str:
    """w0 w1 ... with a line end after every seventh word and a long word now and then."""
    out = []
    for i in range(start, start + count):
        word = f"w{i}" + ("-" + "x" * 30 if i % 11 == 5 else "")
        out.append(word + ("\n" if i % 7 == 6 else " "))
    return "".join(out)


# A screen tmux never reflows stands for a terminal that does not; it has one screenful and no
# history, so less text, and the height kept (a shorter one would cut earlier rows off).
alternate = screen == "alternate"
if alternate:
    sys.stdout.write("\x1b[?1049h\x1b[H")
    STEPS = [(width, 30) for width, _ in STEPS]
per_step = (4, 2) if alternate else (9, 3)
for i in range(earlier):
    print(f"EARLIER line {i} " + "e" * 60)
print("START", flush=True)
console = Console()


def position() -> tuple[int, int]:
    answer = cursor_position(sys.stdin, sys.stdout)
    assert answer is not None  # tmux answers
    return answer


def live(refresh_per_second: float) -> LiveView:
    """A view that asks the terminal for the cursor's row, as tr chat's does."""
    return LiveView(console, lambda t: f"tok{t}", lambda: stats, "path", refresh_per_second, settle, position)


n = 0
assert position() == (min(earlier + 1, 29), 0)
with live(refresh_per_second=0.01) as view:
    for width, height in STEPS:  # each resize between two frames of a known state
        view.push(prefill, words(n, per_step[0]))
        n += per_step[0]
        view._tick()
        resize(width, height)
        view.push(prefill, words(n, per_step[1]))
        n += per_step[1]
        view._tick()
print("RACE", flush=True)
with live(refresh_per_second=200) as view:
    for width in [] if alternate else RACE:  # resizes while frames are drawn every 5 ms
        for _ in range(6):
            view.push(prefill, words(n, 1))
            n += 1
            time.sleep(0.01)
        resize(width, 30, wait=False)
    for _ in range(10):
        view.push(prefill, words(n, 1))
        n += 1
        time.sleep(0.01)
resize(120, 30)
print(f"END {n}", flush=True)
with open(done_file, "w") as done:
    done.write(str(n))
time.sleep(120)
