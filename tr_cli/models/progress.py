"""How long steps (hashing, converting, loading, calibrating) say what they are doing: a callback
taking one line, which the command line shows as a spinner or a status line."""

from __future__ import annotations

from collections.abc import Callable

Status = Callable[[str], None]


def quiet(message: str) -> None:
    """A status callback that shows nothing."""
