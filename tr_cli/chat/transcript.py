"""Conversations as JSON files (/save, /load)."""

from __future__ import annotations

import json
from pathlib import Path

from ..text.input_text import UnreadableText, read_text_file
from .errors import CommandError

SAVE_FORMAT = "tr-chat"
SAVE_VERSION = 1


def conversation_to_json(system: str | None, messages: list[dict], model_id: str | None = None) -> dict:
    return {
        "format": SAVE_FORMAT,
        "version": SAVE_VERSION,
        "model": model_id,
        "system": system,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
    }


def conversation_from_json(data: object) -> tuple[str | None, list[dict]]:
    """(system, messages) from what /save writes, or from a plain list of {role, content}."""
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ValueError('expected {"messages": [{"role": ..., "content": ...}, ...]}')
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise ValueError('"system" must be text')
    messages: list[dict] = []
    for i, m in enumerate(data["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i + 1} has no text content")
        role = m.get("role")
        if role == "system" and not messages:
            system = m["content"]
            continue
        if role not in ("user", "assistant"):
            raise ValueError(f"message {i + 1} has role {role!r}; expected user or assistant")
        messages.append({"role": role, "content": m["content"]})
    return system or None, messages


def write_transcript(path: str | Path, system: str | None, messages: list[dict], model_id: str | None) -> Path:
    target = Path(path).expanduser()
    data = conversation_to_json(system, messages, model_id)
    try:
        target.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def read_transcript(path: str | Path) -> tuple[str | None, list[dict]]:
    source = Path(path).expanduser()
    try:
        return conversation_from_json(json.loads(read_text_file(source)))
    except UnreadableText as exc:  # missing, a folder, not UTF-8, or longer than tr reads (/dev/zero)
        raise CommandError(f"cannot read {source}: {exc.reason}") from None
    except RecursionError:
        raise CommandError(f"{source}: not a saved conversation (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError included
        raise CommandError(f"{source}: not a saved conversation ({exc})") from None
