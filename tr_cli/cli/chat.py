"""`tr chat`: a conversation with Token Recycling, continued from the KV cache turn after turn.

In a terminal: prompt-toolkit reads (history, `\"\"\"` blocks, bracketed paste, tab completion of
slash commands), replies stream above a small live panel of the latest decode step (live_view.py).
Piped: stdin is the message (or one message per line with --each-line), the reply goes to stdout
as plain text, status to stderr. Conversation logic lives in tr_cli/chat/, the terminal side in
chat_app.py.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from ..chat.settings import LIVE_MODES, Settings
from ..engine.options import DecodingOptions
from ..errors import UserError
from ..text.input_text import read_input
from .console import note, stderr
from .options import decoding_options


def read_piped(stream, each_line: bool) -> list[str]:
    data = read_input(stream, "tr chat")
    if each_line:
        return [line.rstrip("\r") for line in data.split("\n") if line.strip()]
    data = data.rstrip("\r\n")
    return [data] if data.strip() else []


def _complete_live(incomplete: str) -> list[str]:
    return [m for m in LIVE_MODES if m.startswith(incomplete)]


System = Annotated[str | None, typer.Option("--system", help="System prompt of the conversation.")]
Live = Annotated[
    str,
    typer.Option(
        "--live",
        autocompletion=_complete_live,
        help="Panel under the reply: path (accepted draft path of each step), tree (the whole draft tree), "
        "off (plain text).",
    ),
]
NoColor = Annotated[bool, typer.Option("--no-color", help="No colors (also: the NO_COLOR environment variable).")]
EachLine = Annotated[
    bool, typer.Option("--each-line", help="Piped input: every line is the next message of one conversation.")
]


@decoding_options()
def chat(
    system: System = None,
    live: Live = "path",
    no_color: NoColor = False,
    each_line: EachLine = False,
    *,
    options: DecodingOptions,
) -> None:
    """Chat with a model: multi-turn from the KV cache, live view of each decode step, slash commands."""
    if no_color:
        stderr.no_color = True
    if live not in LIVE_MODES:
        raise UserError(f"--live {live}: use one of {', '.join(LIVE_MODES)}")
    messages: list[str] | None = None
    if sys.stdin is None or not (sys.stdin.isatty() and sys.stdout.isatty()):
        if sys.stdin is not None and sys.stdin.isatty():
            note("reading one message until Ctrl-D (stdout is not a terminal)")
        messages = read_piped(sys.stdin, each_line)
        if not messages:
            raise UserError("no message on stdin; pipe one in, or run tr chat in a terminal")

    # torch, transformers and prompt-toolkit load here, not for --help
    from ..chat.session import ChatSession
    from .chat_app import ChatApp
    from .prompt_session import make_prompt_session
    from .setup import open_engine

    engine = open_engine(options, banner=False)  # the chat prints it (with the template notice)
    loaded = engine.loaded
    settings = Settings(max_new_tokens=options.max_new_tokens, live=live, sampling=options.sampling)
    session = ChatSession(
        loaded.tokenizer,
        engine.decoder,
        loaded.eos_token_ids,
        system=system,
        settings=settings,
        max_positions=loaded.context_length,
        model_id=loaded.model_id,
    )
    no_color_flag = True if no_color else None  # None: Rich follows NO_COLOR
    err = Console(stderr=True, highlight=False, soft_wrap=True, no_color=no_color_flag)
    if messages is not None:
        out = Console(highlight=False, soft_wrap=True, no_color=True, force_terminal=False)
        code = ChatApp(engine, session, out, err).piped(messages)
    else:
        out = Console(highlight=False, no_color=no_color_flag)
        app = ChatApp(engine, session, out, err)
        code = app.repl(make_prompt_session(no_color=no_color or bool(os.environ.get("NO_COLOR")), err=err))
    raise typer.Exit(code)
