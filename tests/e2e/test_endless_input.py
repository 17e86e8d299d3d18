"""Endless input (43.4): /dev/zero and /dev/urandom as a prompt, a prompt file, a report, a schema
or a corpus are refused in one line after a bounded read, before any model loads (they used to
be read whole: GBs in seconds, Ctrl-C and SIGTERM ignored meanwhile). An input that never ends
yet stays under its bound (a pipe or FIFO fed slowly, keys typed without end) is read until a
signal: SIGINT or SIGTERM stops `tr chat` at once, with its exit status, what it learned saved."""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.test_chat_cli import STATS, Terminal, chat_command, environment, needs_pty
from e2e.test_fault_injection import (
    CAUGHT_LINE,
    EXIT,
    SAVED_ROWS,
    Tr,
    matrix_path,
    no_tr_left_running,  # noqa: F401 - autouse: no Tr of a failed test left running
    seeded,
    stored,
)
from typer.testing import CliRunner

from tr_cli.cli import app

BIN = Path(sys.executable).parent
runner = CliRunner()


def _capped() -> None:
    """A child that reads without bound fails on memory instead of filling the machine's."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize(
    "args", [["generate", "-p", "-"], ["chat"], ["chat", "--each-line"]], ids=["generate", "chat", "each-line"]
)
def test_endless_standard_input_is_one_line(home, args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TR_HOME": str(home)}
    with open("/dev/zero", "rb") as zero:
        out = subprocess.run(
            [str(BIN / "tr"), *args], stdin=zero, capture_output=True, env=env, timeout=120, preexec_fn=_capped
        )
    lines = out.stderr.decode().strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert "standard input holds more than 8 MB, the most tr reads as one message" in lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["bench", "/dev/zero"], "/dev/zero: more than the 64 MB tr reads from one file"),
        (["bench", "/dev/urandom"], "/dev/urandom: cannot read it as UTF-8 text"),
        (["bench", "--from-report", "/dev/zero"], "/dev/zero: more than the 64 MB"),
        (["generate", "--schema", "/dev/zero", "-p", "hi"], "--schema /dev/zero: more than the 64 MB"),
        (["matrix", "init", "--from", "/dev/zero"], "--from /dev/zero: more than the 64 MB"),
    ],
)
def test_an_endless_file_is_one_line_before_the_model_loads(home, args, words):
    out = runner.invoke(app, args)
    assert out.exit_code == 1, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], out.output


# -- a signal while reading an endless input ------------------------------------------------------

SIGNALS = pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
STOPS_WITHIN = 5.0  # seconds from the (last) signal to the exit
BUGS = ("Traceback", "Exception ignored", "unhandled exception", "Task was destroyed", "never retrieved")


def unread(fd: int) -> int:
    """Bytes written to a pipe, FIFO or terminal's input that no reader has taken yet."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


@contextlib.contextmanager
def feeding(fd: int, chunk: bytes, every: float = 0.05) -> Iterator[None]:
    """A writer that keeps writing `chunk` to `fd` every `every` seconds and never ends the input."""
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            try:
                os.write(fd, chunk)
            except OSError:  # the reader is gone
                return
            stop.wait(every)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def wait_until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def assert_saved(home: Path, text: str) -> None:
    """The run's final save happened (what the signal tests of test_fault_injection.py check): the
    matrix grew by the rows the run says it saved, the store holds the conversation, whole files."""
    start, state = seeded(), stored(home)
    saved = SAVED_ROWS.search(text)
    assert saved and state.matrix is not None, f"no matrix saved to {matrix_path(home)}:\n{text[-3000:]}"
    rows = int(saved[1].replace(",", ""))
    assert rows > 0 and state.matrix.meta.update_count == start.matrix.meta.update_count + rows
    assert state.store is not None and len(state.store.documents) == len(start.store.documents) + 1
    assert state.temps == [] and state.corrupt == []


@SIGNALS
def test_a_signal_stops_a_piped_chat_reading_a_pipe_that_never_ends(home, sig):
    """Piped `tr chat` reads its whole stdin before it loads the model: a pipe a writer keeps
    feeding and never closes is read until the signal, which ends tr at once with its exit status
    and last line. Nothing was learned yet, so nothing is written."""
    reader, writer = os.pipe()
    try:
        run = Tr(home, "chat", stdin=reader)
    finally:
        os.close(reader)
    try:
        os.write(writer, b"Tell me about ")
        wait_until(lambda: unread(writer) == 0, "tr to read its stdin")  # tr is inside its read
        with feeding(writer, b"more and more "):
            time.sleep(0.5)
            assert run.proc.poll() is None, run.err
            run.proc.send_signal(sig)
            sent = time.monotonic()
            code = run.finish(60)
            took = time.monotonic() - sent
    finally:
        os.close(writer)
    assert code == EXIT[sig], run.err
    assert took < STOPS_WITHIN, f"tr took {took:.1f} s to stop"
    assert run.err.strip().splitlines() == [CAUGHT_LINE[sig]]
    assert run.out == "" and not (home / "data" / "matrices").exists()


@needs_pty
@SIGNALS
@pytest.mark.parametrize("source", ["typed", "load"])
def test_a_signal_stops_a_chat_reading_endless_input_and_saves(home, tmp_path, source, sig):
    """`tr chat` in a terminal on the packaged model, one turn answered, then reading an input
    that never ends: keys typed without end at the prompt (no Enter), or `/load` of a FIFO a writer
    keeps feeding and never closes. SIGTERM ends tr at once: exit 143, the matrix and the
    conversation saved. SIGINT is Ctrl-C: the first drops the input (the typed line, the /load) and
    the chat goes on; a second within a second leaves: exit 130, saved (docs/chat.md)."""
    # Dense float32 weights and a fixed tree: seconds to load (no int4 repacking), no t(N) to
    # measure; +store24 drafts from the recycled store, which the conversation then joins.
    args = [*chat_command(), "--weights", "dense", "--tree", "paper+store24", "-n", "8", "--live", "off"]
    term = Terminal(args, environment(home, NO_COLOR="1", TR_NOHISTORY="1"))
    fifo = tmp_path / "endless.json"
    os.mkfifo(fifo)
    fed = os.open(fifo, os.O_RDWR)  # a writer that never closes: the FIFO never ends
    try:
        term.ask("Hello there\r", STATS)  # one turn: rows learned, a conversation to store
        if source == "typed":
            # Keys stop just before the signal (the line still unfinished): keys typed after it
            # would be echoed by the terminal once tr leaves raw mode, after its last line.
            typing = feeding(term.fd, b"a")
            with typing:
                term.expect(lambda text: "aaaa" in text.rpartition(">>>")[2], "the keys at the prompt")
                time.sleep(0.5)
            feed = contextlib.nullcontext()
        else:
            os.write(fed, b'{"messages": [')
            term.send(f"/load {fifo}\r")
            feed = feeding(fed, b'{"role": "user", "content": "hi"}, ')
        with feed:
            if source == "load":  # tr has the FIFO open and has read what was written: inside its read
                term.expect(lambda text: Tr.holds_open(term, fifo) and unread(fed) == 0, "tr reading the FIFO")
                time.sleep(0.5)
            assert term.proc.poll() is None, term.text[-3000:]
            if sig == signal.SIGINT:
                term.proc.send_signal(sig)
                hint = "Ctrl-C again to quit"
                term.expect(lambda text: hint in text and ">>>" in text.rpartition(hint)[2], "the hint, the prompt")
                assert term.proc.poll() is None and not Tr.holds_open(term, fifo), term.text[-3000:]
            term.proc.send_signal(sig)
            sent = time.monotonic()
            code = term.wait(30)
            took = time.monotonic() - sent
    finally:
        term.close()
        os.close(fed)
    text = term.text
    assert code == EXIT[sig], text[-3000:]
    assert took < STOPS_WITHIN, f"tr took {took:.1f} s to stop"
    assert not [bug for bug in BUGS if bug in text], text[-3000:]
    if sig == signal.SIGTERM:
        assert text.strip().splitlines()[-1] == CAUGHT_LINE[sig], text[-3000:]
    else:
        assert text.count("Ctrl-C again to quit") == 1, text[-3000:]
    assert "Loaded" not in text  # the endless /load never finished
    assert_saved(home, text)
