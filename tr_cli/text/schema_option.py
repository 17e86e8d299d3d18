"""The grammar a command-line reply must match: `--schema` (a JSON Schema file, or its JSON text)
or `--json` (any JSON object), read and checked once at the edge, before a model loads; and the
constraints that enforce grammars on a loaded model (`tr generate`, `tr bench`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from .grammar import Grammar, GrammarError
from .input_text import UnreadableText, read_text_file

if TYPE_CHECKING:
    import torch

    from .grammar import GrammarConstraint


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
    if _is_inline(schema):
        where, text = "--schema", schema
    else:
        where, text = _read_schema_file(schema)
    try:
        value = json.loads(text.lstrip("\ufeff"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg}); fix the schema") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to read; fix the schema") from None
    except ValueError as exc:  # an integer literal past Python's digit limit (sys.get_int_max_str_digits)
        raise UserError(f"{where}: not JSON ({str(exc).split(';')[0]}); fix the schema") from None
    try:
        return Grammar.json_schema(value, strict=True, name=where)
    except GrammarError as exc:
        raise UserError(f"{exc}; fix the schema") from None


def grammar_constraints(
    tokenizer: object, model: torch.nn.Module, stop_ids: Iterable[int], refused: str
) -> Callable[[Grammar], GrammarConstraint]:
    """Fresh constraints in a grammar's initial state, from one compiler built on first use for
    this model's tokenizer and output vocabulary. A tokenizer or grammar llguidance refuses is a
    one-line UserError ending in `refused` (what the user cannot do, e.g. "--schema cannot be used
    with this model")."""
    from ..core.matrix import output_vocab_size
    from .grammar import GrammarCompiler

    compiler: GrammarCompiler | None = None

    def constraint_of(grammar: Grammar) -> GrammarConstraint:
        nonlocal compiler
        try:
            if compiler is None:
                compiler = GrammarCompiler(tokenizer, output_vocab_size(model), stop_ids)
            return compiler.constraint(grammar)
        except GrammarError as exc:
            raise UserError(f"{exc}; {refused}") from None

    return constraint_of


def _is_inline(value: str) -> bool:
    """Whether `--schema VALUE` is the schema's JSON text rather than a path: an object, or the
    schemas `true`/`false` (a byte-order mark or spaces before them allowed)."""
    text = value.strip("\ufeff \t\r\n")
    return text.startswith("{") or text in ("true", "false")


def _read_schema_file(value: str) -> tuple[str, str]:
    """(the path as said in errors, the file's text); a one-line UserError naming the path when it
    is missing, a folder, unreadable or too long (a FIFO or device is read as it comes, bounded)."""
    try:
        path = Path(value).expanduser()
    except RuntimeError as exc:  # an unresolvable ~user
        raise UserError(f"--schema {value}: cannot use this path ({exc}); give a JSON Schema file") from None
    try:
        return str(path), read_text_file(path)
    except UnreadableText as exc:
        remedy = "give a JSON Schema file or the schema's JSON text"
        if exc.reason.startswith("cannot use this path"):
            remedy = "give a JSON Schema file"
        raise UserError(f"--schema {value}: {exc.reason}; {remedy}") from None
