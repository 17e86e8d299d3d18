"""Errors of a chat turn or command: shown to the user, and the chat goes on."""

from __future__ import annotations

from ..errors import UserError


class CommandError(UserError):
    """A slash command or message that cannot run as typed; the message says why (nothing is
    sent to the model)."""


class ContextFull(CommandError):
    """The conversation leaves no room in the model's context for another reply.

    The advice depends on where the messages come from: in the terminal the chat goes on, so
    /clear or a shorter message helps; piped, the run ends here, so it says what to change in
    the next run (piped mode has no slash commands)."""

    def __init__(self, limit: int, *, piped: bool, earlier_messages: int, system: bool) -> None:
        context = f"the model's context ({limit:,} tokens)"
        if earlier_messages == 0:  # the message alone is too long: /clear would not help
            what = "the message from stdin" if piped else "this message"
            shorter = "pipe in a shorter one" if piped else "send a shorter one"
            if system:
                shorter += " (or a shorter " + ("--system)" if piped else "/system prompt)")
            message = f"{what} leaves no room for a reply in {context}; {shorter}"
        elif piped:
            message = (
                f"the conversation fills {context} after {earlier_messages} message"
                f"{'s' if earlier_messages != 1 else ''}; pipe fewer "
                "--each-line messages per run (each run starts a new conversation), or lower "
                "--max-new-tokens for shorter replies"
            )
        else:
            message = f"the conversation fills {context}; /clear starts a new one"
        super().__init__(message)
