"""The chat prompt (prompt-toolkit): input history in the data dir, tab completion of slash
commands, bracketed paste."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from ..chat.commands import complete
from ..store.paths import data_dir
from .console import stderr, warn
from .interrupts import ending_app

HISTORY_FILE = "chat_history"


def history_unusable(path: Path, exc: OSError) -> str:
    """The one-line warning for a history file tr cannot read or append to: what is wrong with
    it and how to get history back (the chat goes on without it)."""
    if isinstance(exc, IsADirectoryError):
        problem, fix = "is a directory", "remove or rename it"
    elif isinstance(exc, PermissionError):
        problem, fix = "is not readable and writable by you", "fix its permissions (chmod u+rw)"
    elif path.parent.exists() and not path.parent.is_dir():
        problem, fix = f"cannot be created ({path.parent} is a file)", "move that file away"
    else:
        problem, fix = f"cannot be used ({exc.strerror or exc})", "check that path"
    return f"input history off for this chat: {path} {problem}; {fix}, or set TR_NOHISTORY=1 to go without"


def _guarded_history(path: Path):
    """A FileHistory that survives its file going bad mid-chat (disk full, replaced by a
    directory): the first failure is kept for `report()` and the history goes on in memory."""
    from prompt_toolkit.history import FileHistory

    class GuardedFileHistory(FileHistory):
        def __init__(self) -> None:
            super().__init__(str(path))
            self.failure: OSError | None = None
            self.reported = False

        def load_history_strings(self):
            if self.failure is None:
                try:
                    return list(super().load_history_strings())
                except OSError as exc:
                    self.failure = exc
            return []

        def store_string(self, string: str) -> None:
            if self.failure is None:
                try:
                    super().store_string(string)
                except OSError as exc:
                    self.failure = exc

        def report(self, console: Console) -> None:
            # Called between prompts: a warning printed while prompt-toolkit draws would be
            # overwritten by its next redraw.
            if self.failure is not None and not self.reported:
                self.reported = True
                warn(history_unusable(path, self.failure), console)

    return GuardedFileHistory()


def _history(console: Console):
    from prompt_toolkit.history import InMemoryHistory

    if os.environ.get("TR_NOHISTORY", "") not in ("", "0"):
        return InMemoryHistory()
    path = data_dir() / HISTORY_FILE
    try:  # what prompt-toolkit will do (read it all, append each input), tried before the first prompt
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
        with open(path, "rb"):
            pass
    except OSError as exc:
        warn(history_unusable(path, exc), console)
        return InMemoryHistory()
    return _guarded_history(path)


def make_prompt_session(no_color: bool = False, input=None, output=None, err: Console | None = None):
    """prompt-toolkit session: history file, tab completion of slash commands, bracketed paste.
    A history file that cannot be used is one warning on `err`; the chat goes on without it."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import Completer, Completion
    from prompt_toolkit.output import ColorDepth

    console = err or stderr

    class SlashCompleter(Completer):
        def get_completions(self, document, complete_event):
            text = document.text_before_cursor
            if "\n" in text:
                return
            word = text.split(" ")[-1]
            for candidate in complete(text):
                yield Completion(candidate, start_position=-len(word))

    class ChatPromptSession(PromptSession):
        def prompt(self, *args, **kwargs):
            try:
                with ending_app(self.app):
                    return super().prompt(*args, **kwargs)
            finally:
                report = getattr(self.history, "report", None)
                if report is not None:
                    report(console)

    return ChatPromptSession(
        history=_history(console),
        completer=SlashCompleter(),
        complete_while_typing=False,
        color_depth=ColorDepth.MONOCHROME if no_color else None,
        input=input,
        output=output,
    )
