"""Slash commands: their names, help, parsing and tab completion."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CommandError
from .settings import LIVE_MODES, SETTING_KEYS

SHOW_TOPICS = ("settings", "model", "template", "matrix")


@dataclass(frozen=True)
class CommandSpec:
    name: str
    aliases: tuple[str, ...]
    usage: str
    help: str
    arguments: tuple[str, ...] = ()  # completions of the first argument


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("/help", ("/?",), "", "list the commands"),
    CommandSpec("/clear", (), "", "forget the conversation (the matrix stays)"),
    CommandSpec("/system", (), "[TEXT]", "show or set the system prompt (/system - removes it)"),
    CommandSpec(
        "/set",
        (),
        "KEY VALUE",
        "max_new_tokens N, temperature T (0 = greedy), top_p P, top_k K, repetition_penalty R, seed N|random, "
        "live path|tree|off, verbose on|off",
        SETTING_KEYS,
    ),
    CommandSpec("/show", (), "TOPIC", "settings, model, template or matrix", SHOW_TOPICS),
    CommandSpec("/save", (), "FILE", "write the conversation to a JSON file"),
    CommandSpec("/load", (), "FILE", "continue a conversation written by /save"),
    CommandSpec("/retry", (), "", "generate the last reply again"),
    CommandSpec("/bye", ("/exit",), "", "save the matrix and leave (also Ctrl-D)"),
)
_BY_NAME = {name: spec for spec in COMMANDS for name in (spec.name, *spec.aliases)}
_SET_VALUES = {
    "live": LIVE_MODES,
    "verbose": ("on", "off"),
    "seed": ("random",),
    "top_p": ("default",),
    "top_k": ("default",),
    "repetition_penalty": ("default",),
    "temperature": ("default",),
}


def help_lines() -> list[tuple[str, str]]:
    """(command with usage, what it does) rows for /help."""
    rows = []
    for spec in COMMANDS:
        names = ", ".join((spec.name, *spec.aliases))
        rows.append((f"{names} {spec.usage}".rstrip(), spec.help))
    rows.append(('"""', 'start a multi-line message; end it with a line ending in """'))
    rows.append(("//text", "send a message that starts with '/' (as /text)"))
    return rows


def parse_command(line: str) -> tuple[str, str]:
    """`/name arg...` -> (canonical name, argument text). Unknown names raise CommandError."""
    stripped = line.strip()
    name, _, arg = stripped.partition(" ")
    spec = _BY_NAME.get(name.lower())
    if spec is None:
        raise CommandError(f"Unknown command {name} — /help lists them")
    return spec.name, arg.strip()


def complete(text: str) -> list[str]:
    """Completions of a partly typed slash command line (for tab completion): full replacements
    of the last word."""
    if not text.startswith("/"):
        return []
    words = text.split(" ")
    if len(words) == 1:
        prefix = words[0].lower()
        names = [n for spec in COMMANDS for n in (spec.name, *spec.aliases)]
        return [n for n in names if n.startswith(prefix)]
    spec = _BY_NAME.get(words[0].lower())
    if spec is None:
        return []
    if len(words) == 2:
        return [a for a in spec.arguments if a.startswith(words[1].lower())]
    if len(words) == 3 and spec.name == "/set":
        return [v for v in _SET_VALUES.get(words[1].lower(), ()) if v.startswith(words[2].lower())]
    return []
