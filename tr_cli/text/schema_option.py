"""The grammar a command-line reply must match: `--schema` (a JSON Schema file, or its JSON text)
or `--json` (any JSON object), read and checked once at the edge, before a model loads."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from .grammar import Grammar, GrammarError
from .prompts import read_utf8


def reply_grammar(schema: str | None, json_object: bool) -> Grammar | None:
    """The grammar `--schema VALUE` / `--json` ask for, or None for free text. VALUE is a file's
    path, or the schema itself when it starts with `{`. Strict: a keyword the grammar engine cannot
    enforce is an error, as for `strict: true` in the server's `response_format`."""
    if schema is not None and json_object:
        raise UserError("--schema and --json: give one (a schema's replies are JSON already)")
    if json_object:
        return Grammar.json_object()
    if schema is None:
        return None
    if schema.lstrip().startswith("{"):
        where, text = "--schema", schema
    else:
        path = Path(schema).expanduser()
        if not path.is_file():
            raise UserError(f"--schema {schema}: no such file; give a JSON Schema file or the schema's JSON text")
        where, text = str(path), read_utf8(path, "--schema ")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg}); fix the schema") from None
    try:
        return Grammar.json_schema(value, strict=True, name=where)
    except GrammarError as exc:
        raise UserError(f"{exc}; fix the schema") from None
