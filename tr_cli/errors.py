"""Errors caused by the user's input: shown as one line, exit code 1, no traceback."""


class UserError(Exception):
    """A problem with what the user asked for; the message says what to do."""
