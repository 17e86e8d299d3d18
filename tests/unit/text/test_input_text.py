"""Bounded reads of what a user hands in (tr_cli/text/input_text.py): every input has a limit, an
endless source (/dev/zero, /dev/urandom) is refused after a bounded read with one line that says
so, and the read is made in chunks so that a signal stops it."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tr_cli.errors import UserError
from tr_cli.text.input_text import (
    MAX_FILE_BYTES,
    MAX_MESSAGE_BYTES,
    InputTooLong,
    UnreadableText,
    read_input,
    read_text_file,
)

ROOT = Path(__file__).resolve().parents[3]


def test_an_endless_device_is_refused_at_the_file_limit():
    with pytest.raises(UnreadableText) as caught:
        read_text_file("/dev/zero", "--schema ")
    message = str(caught.value)
    assert message.startswith("--schema /dev/zero: more than the 64 MB tr reads from one file"), message
    assert "endless" in message and "\n" not in message


def test_random_bytes_stop_at_the_first_byte_that_is_not_utf8():
    started = time.monotonic()
    with pytest.raises(UnreadableText, match="cannot read it as UTF-8 text"):
        read_text_file("/dev/urandom")
    assert time.monotonic() - started < 30  # one chunk, not 64 MB (a generous bound: a loaded CI machine)


def test_a_regular_file_past_the_limit_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.txt"
    with big.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(UnreadableText, match=r"big.txt: 64 MB, more than the 64 MB tr reads from one file$"):
        read_text_file(big)


def test_a_fifo_is_read_as_it_comes(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("café\n", encoding="utf-8"))
    writer.start()
    assert read_text_file(fifo) == "café\n"
    writer.join()


def test_a_bad_byte_is_placed_across_chunks(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"a" * (1 << 20) + b"caf\xe9")  # the bad byte in the second chunk
    with pytest.raises(UnreadableText, match=f"byte 0xe9 at byte {(1 << 20) + 4:,} is not UTF-8"):
        read_text_file(path)


class Endless(io.RawIOBase):
    """Standard input that never ends (`< /dev/zero`), counting what was read from it."""

    def __init__(self) -> None:
        self.taken = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        buffer[:] = b"\0" * len(buffer)
        self.taken += len(buffer)
        return len(buffer)


def test_endless_standard_input_is_refused_at_the_message_limit():
    raw = Endless()
    stream = io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="surrogateescape")
    with pytest.raises(InputTooLong) as caught:
        read_input(stream, "--prompt -")
    assert str(caught.value).startswith("--prompt -: standard input holds more than 8 MB")
    assert raw.taken < 2 * MAX_MESSAGE_BYTES
    with pytest.raises(InputTooLong):
        read_input(io.StringIO("x" * (MAX_MESSAGE_BYTES + 1)), "tr chat")
    assert read_input(io.StringIO("hi"), "tr chat") == "hi"


def test_not_utf8_on_standard_input_is_still_named_by_character():
    stream = io.TextIOWrapper(io.BytesIO(b"caf\xe9"), encoding="utf-8", errors="surrogateescape")
    with pytest.raises(UserError, match="byte 0xe9 at character 4 is not valid UTF-8"):
        read_input(stream, "tr chat")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_read_of_an_endless_device(sig):
    """One unbounded read() of /dev/zero is a C call that runs no signal handler until it returns:
    tr grew to GBs and ignored Ctrl-C and SIGTERM. Here the limit is out of reach (1 TB), so only
    the signal can end the read; the child's address space is capped so a read that ignores it
    fails on memory instead of filling this machine's. Ctrl-C raises in the child as in a terminal
    even where the test run itself inherited SIGINT ignored (started in the background: `cmd &`)."""
    code = (
        "import resource, signal, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
        "from tr_cli.text.input_text import read_text_file\n"
        "print('reading', flush=True)\n"
        "read_text_file('/dev/zero', limit=1 << 40)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout.readline() == b"reading\n"
    child.send_signal(sig)
    _, err = child.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert b"KeyboardInterrupt" in err, err
    else:
        assert child.returncode == 42, err
