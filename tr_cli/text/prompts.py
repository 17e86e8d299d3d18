"""Prompt sets: Spec-Bench JSONL, JSONL with a `prompt` field, plain text, and the bundled sample.

Errors name the file and line and say what was expected.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from .input_text import read_text_file

if TYPE_CHECKING:
    from .grammar import Grammar

SAMPLE = "sample"  # the name under which the bundled prompt set is accepted


@dataclass(frozen=True)
class PromptRecord:
    id: str
    category: str
    turns: tuple[str, ...]
    schema: Grammar | None = None  # a JSON schema every reply must match (structured output)


def _parse_jsonl(text: str, where: str) -> list[PromptRecord]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}:{number}: not valid JSON ({exc.msg}); write one JSON object per line") from None
        except RecursionError:  # the decoder recurses once per level: "[" * 100000 exhausts the stack
            raise UserError(f"{where}:{number}: nested too deeply to read; write one JSON object per line") from None
        except ValueError as exc:  # an integer literal past Python's digit limit (sys.get_int_max_str_digits)
            reason = str(exc).split(";")[0]
            raise UserError(f"{where}:{number}: not valid JSON ({reason}); write one JSON object per line") from None
        if not isinstance(row, dict):
            raise UserError(f'{where}:{number}: expected a JSON object with "turns" or "prompt"')
        ident = str(row.get("question_id", row.get("id", len(records) + 1)))
        category = str(row.get("category", "default"))
        if "turns" in row:
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
                raise UserError(f'{where}:{number}: "turns" must be a non-empty list of non-empty strings')
        elif "prompt" in row:
            if not isinstance(row["prompt"], str) or not row["prompt"].strip():
                raise UserError(f'{where}:{number}: "prompt" must be a non-empty string')
            turns = [row["prompt"]]
        else:
            raise UserError(f'{where}:{number}: expected a "turns" list (Spec-Bench format) or a "prompt" string')
        records.append(PromptRecord(ident, category, tuple(turns), _schema(row, f"{where}:{number}")))
    return records


def _schema(row: dict, where: str) -> Grammar | None:
    """A record's "schema" (a JSON schema its replies must match), checked where it is read."""
    if "schema" not in row:
        return None
    from .grammar import Grammar, GrammarError

    try:
        return Grammar.json_schema(row["schema"], strict=True, name=f'{where}: "schema"')
    except GrammarError as exc:
        raise UserError(f"{exc}; fix the schema or drop the field") from None


def text_blocks(text: str) -> list[str]:
    """Paragraphs: the text's blocks separated by blank lines, stripped."""
    return [block.strip() for block in text.replace("\r\n", "\n").split("\n\n") if block.strip()]


def _parse_text(text: str) -> list[PromptRecord]:
    return [PromptRecord(str(i), "default", (block,)) for i, block in enumerate(text_blocks(text), 1)]


def read_prompt_file(path: Path) -> list[PromptRecord]:
    """A JSONL file (one record per line) or plain text (one prompt per blank-line-separated block)."""
    if not path.exists():
        raise UserError(f"{path}: no such prompt file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory; name a prompt file")
    text = read_text_file(path)  # read once: a FIFO (`tr bench <(...)`) or /dev/stdin is read as it comes
    first = next((line for line in text.splitlines() if line.strip()), "")
    if path.suffix in (".jsonl", ".json") or first.lstrip().startswith("{"):
        return _parse_jsonl(text, str(path))
    return _parse_text(text)


def sample_prompts() -> list[PromptRecord]:
    """The prompts shipped with tr: a few per Spec-Bench category, written for this project."""
    text = resources.files("tr_cli.data").joinpath("sample_prompts.jsonl").read_text(encoding="utf-8")
    return _parse_jsonl(text, "tr_cli/data/sample_prompts.jsonl")


def load_prompts(source: str | Path | None) -> list[PromptRecord]:
    """The bundled sample (None or "sample") or a prompt file."""
    if source is None or str(source) == SAMPLE:
        return sample_prompts()
    return read_prompt_file(Path(source))


def select_prompts(
    records: list[PromptRecord], categories: list[str], per_category: int | None, limit: int | None, source: str
) -> list[PromptRecord]:
    """Keep the given categories (all when empty), then the first `per_category` of each, then
    the first `limit` overall."""
    if categories:
        known = sorted({r.category for r in records})
        missing = [c for c in categories if c not in known]
        if missing:
            raise UserError(f"--categories: {', '.join(missing)} not in {source} (it has: {', '.join(known)})")
        records = [r for r in records if r.category in categories]
    if per_category:
        seen: Counter[str] = Counter()
        kept = []
        for record in records:
            seen[record.category] += 1
            if seen[record.category] <= per_category:
                kept.append(record)
        records = kept
    return records[:limit] if limit else records
