"""The command line's error boundary: every command runs inside it.

A TrError (bad input, an unusable file, a model tr cannot decode; tr_cli/errors.py) becomes one
line on stderr and exit status 1; Ctrl-C becomes "interrupted" and exit status 130, SIGTERM and
SIGHUP "terminated" and 128 + the signal (the matrix is saved on the way out either way); any
other exception one line and exit status 1 (TR_DEBUG=1 shows its traceback for bug reports).
Commands raise errors and never print them themselves.
"""

from __future__ import annotations

import signal

import typer
from typer.core import TyperGroup

from ..errors import SettingError, TrError, first_line
from ..store.remedies import FixableError
from .console import OutputError, debugging, error, stderr
from .interrupts import Terminated, terminating_signals
from .store_errors import in_flag_words

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_READER_LEFT = 128 + signal.SIGPIPE  # what a tool killed by SIGPIPE reports


def _command_line_flow(exc: BaseException) -> bool:
    """Typer's and click's own exceptions (exit codes, usage errors, aborts): theirs to handle.
    Typer ships its own copy of click, so they are recognised by the package that defines them."""
    return type(exc).__module__.split(".")[0] in ("typer", "click")


# Settings whose flag is not `--` + their name.
_FLAGS = {"model": "MODEL", "save": "--no-save"}


def flag(setting: str) -> str:
    """The command-line spelling of a setting: 'top_p' -> '--top-p'."""
    return _FLAGS.get(setting, "--" + setting.replace("_", "-"))


def message(exc: TrError) -> str:
    """The one line a command prints for `exc`; a setting, or a remedy of stored state, is named
    as its flag."""
    if isinstance(exc, FixableError):
        return str(in_flag_words(exc))
    if isinstance(exc, SettingError):
        if exc.value == "":  # nothing to quote: 'MODEL is empty; ...'
            return f"{flag(exc.setting)} {exc.reason}"
        return f"{flag(exc.setting)} {exc.value}: {exc.reason}"
    return str(exc)


class ErrorBoundary(TyperGroup):
    """The app's command group: runs the chosen command, translating what it raises."""

    def invoke(self, ctx: typer.Context):
        try:
            with terminating_signals():
                return super().invoke(ctx)
        except TrError as exc:
            if isinstance(exc, OutputError) and exc.reader_left:  # `tr generate | head`: quiet, as any tool
                raise typer.Exit(EXIT_READER_LEFT) from None
            error(message(exc))
            raise typer.Exit(EXIT_ERROR) from None
        except Terminated as exc:
            stderr.print(f"terminated ({exc})")
            raise typer.Exit(128 + exc.signum) from None
        except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen fault: one line, unless debugging
            if _command_line_flow(exc) or debugging():
                raise
            error(f"unexpected {type(exc).__name__}: {first_line(exc)} (TR_DEBUG=1 shows the traceback)")
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            stderr.print("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
