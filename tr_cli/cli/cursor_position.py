"""Where the terminal's cursor is, asked of the terminal itself (a cursor position report).

The live view needs it to know how many rows of text are above it on the screen; nothing the
program printed tells, since the screen held whatever was there before it started.
"""

from __future__ import annotations

import os
import re
import select
import time

CURSOR_REPORT = re.compile(rb"\x1b\[(\d+);(\d+)R")
DEVICE_ATTRIBUTES = re.compile(rb"\x1b\[\?[0-9;]*c")
TIMEOUT_SECONDS = 0.3


def cursor_position(stdin, stdout, timeout: float = TIMEOUT_SECONDS) -> tuple[int, int] | None:
    """The cursor's row and column on the screen, (0, 0) at the top left; None where the terminal
    does not say (not a terminal, no answer within `timeout`). The position request is followed by one for the device
    attributes, which every terminal answers after it: the last position report before that answer
    is this one's, not a late answer to an earlier request (prompt-toolkit asks too). Keys typed
    in those milliseconds are read with it, and lost."""
    try:
        import termios

        fd, out = stdin.fileno(), stdout.fileno()
        if not (os.isatty(fd) and os.isatty(out)):
            return None
        old = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    raw = list(old)
    raw[3] &= ~(termios.ICANON | termios.ECHO)
    raw[6] = list(raw[6])
    raw[6][termios.VMIN], raw[6][termios.VTIME] = 0, 0
    answer = b""
    try:
        termios.tcsetattr(fd, termios.TCSANOW, raw)
        stdout.flush()
        os.write(out, b"\x1b[6n\x1b[c")
        deadline = time.monotonic() + timeout
        while not DEVICE_ATTRIBUTES.search(answer):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            answer += os.read(fd, 1024)
    except OSError:
        return None
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, old)
    fence = DEVICE_ATTRIBUTES.search(answer)
    reports = CURSOR_REPORT.findall(answer[: fence.start()] if fence else answer)
    return (int(reports[-1][0]) - 1, int(reports[-1][1]) - 1) if reports else None
