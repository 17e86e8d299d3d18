"""The terminal streams: generated text to stdout (`write_out`), status to one stderr console
with its line styles."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
from rich.text import Text

from ..core.errors import TrError

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def note(message: str, console: Console = stderr) -> None:
    """A dim status line (model loading, matrix saved, ...)."""
    console.print(Text(message, style="dim"), soft_wrap=True)


def warn(message: str, console: Console = stderr) -> None:
    """A one-line warning: something went wrong, and the command goes on."""
    console.print(Text(f"tr: warning: {message}", style="yellow"), soft_wrap=True)


def error(message: str, console: Console = stderr) -> None:
    """The one line of a command that fails."""
    line = Text("tr: error:", style="bold red")
    line.append(f" {message}")
    console.print(line, soft_wrap=True)


class OutputError(TrError):
    """Standard output cannot take the text: a reader that left (a closed pipe) or a full or
    failing device. The command still saves what it learned on its way out."""

    def __init__(self, exc: OSError) -> None:
        self.reader_left = isinstance(exc, BrokenPipeError)
        super().__init__(f"cannot write to standard output ({os.strerror(exc.errno) if exc.errno else exc})")


def write_out(text: str, stream: TextIO | None = None) -> None:
    """Generated text to stdout (or the `stream` standing for it), at once. A failed write is an
    OutputError; the stream's file descriptor then points to /dev/null, so the writes still on
    the way out (a reply's last bytes, Python's own flush at exit) neither fail again nor print
    "Exception ignored"."""
    stream = sys.stdout if stream is None else stream
    try:
        stream.write(text)
        stream.flush()
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EINVAL):
            raise
        _discard(stream)
        raise OutputError(exc) from None


def _discard(stream: TextIO) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def progress_bar(clock: ProgressColumn) -> Progress:
    """A transient progress bar on stderr: the task's description, the bar, done/total and `clock`
    (time elapsed or remaining)."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), clock, console=stderr, transient=True
    )


def debugging() -> bool:
    """TR_DEBUG=1: tracebacks for unexpected errors, and where a start's time went."""
    return bool(os.environ.get("TR_DEBUG"))
