"""The terminal streams every command writes status to: one stderr console, and its line styles."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

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
