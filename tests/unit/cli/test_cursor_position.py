"""tr_cli/cli/cursor_position.py on a pty whose other end plays the terminal."""

from __future__ import annotations

import io
import os
import sys
import threading

if sys.platform != "win32":
    import termios

import pytest

from tr_cli.cli.cursor_position import cursor_position

needs_pty = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pty")


def answered(reply: bytes | None, before: bytes = b"", timeout: float = 0.3):
    """cursor_position on a pty; the terminal end answers the two requests with `reply` (None:
    never), after `before` was already waiting to be read (a late answer to an earlier request)."""
    master, slave = os.openpty()
    attributes = termios.tcgetattr(slave)
    attributes[3] &= ~termios.ECHO  # as while a reply streams (no_echo)
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    if before:
        os.write(master, before)
    asked = []

    def terminal() -> None:
        request = b""
        while b"\x1b[c" not in request:
            request += os.read(master, 64)
        asked.append(request)
        if reply is not None:
            os.write(master, reply)

    thread = threading.Thread(target=terminal, daemon=True)
    thread.start()
    with open(slave, closefd=False) as stdin, open(slave, "w", closefd=False) as stdout:
        position = cursor_position(stdin, stdout, timeout=timeout)
    thread.join(2)
    os.close(master)
    os.close(slave)
    return position, asked


@needs_pty
def test_the_terminal_says_where_the_cursor_is():
    position, asked = answered(b"\x1b[5;7R\x1b[?1;2c", before=b"\x1b[1;1R")
    assert asked == [b"\x1b[6n\x1b[c"]
    assert position == (4, 6)  # the last report before the device attributes: not the stale one


@needs_pty
def test_no_answer_or_no_terminal_is_none():
    assert answered(None, timeout=0.1)[0] is None
    assert answered(b"\x1b[?1;2c")[0] is None  # attributes only: no position
    assert cursor_position(io.StringIO(), io.StringIO()) is None
