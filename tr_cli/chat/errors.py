"""Errors of a chat turn or command: shown to the user, and the chat goes on."""

from __future__ import annotations

from ..errors import UserError


class CommandError(UserError):
    """A slash command or message that cannot run as typed; the message says why (nothing is
    sent to the model)."""


class ContextFull(CommandError):
    """The conversation leaves no room in the model's context for another reply."""
