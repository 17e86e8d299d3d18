"""The chat prompt (prompt-toolkit): input history in the data dir, tab completion of slash
commands, bracketed paste."""

from __future__ import annotations

import os

from ..chat.commands import complete
from ..store.paths import data_dir
from .console import warn

HISTORY_FILE = "chat_history"


def _history():
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    if os.environ.get("TR_NOHISTORY", "") not in ("", "0"):
        return InMemoryHistory()
    path = data_dir() / HISTORY_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    except OSError as exc:
        warn(f"no input history ({path}: {exc.strerror or exc})")
        return InMemoryHistory()
    return FileHistory(str(path))


def make_prompt_session(no_color: bool = False, input=None, output=None):
    """prompt-toolkit session: history file, tab completion of slash commands, bracketed paste."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import Completer, Completion
    from prompt_toolkit.output import ColorDepth

    class SlashCompleter(Completer):
        def get_completions(self, document, complete_event):
            text = document.text_before_cursor
            if "\n" in text:
                return
            word = text.split(" ")[-1]
            for candidate in complete(text):
                yield Completion(candidate, start_position=-len(word))

    return PromptSession(
        history=_history(),
        completer=SlashCompleter(),
        complete_while_typing=False,
        color_depth=ColorDepth.MONOCHROME if no_color else None,
        input=input,
        output=output,
    )
