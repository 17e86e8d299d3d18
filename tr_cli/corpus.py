"""Text for `tr matrix init`: plain text files (running text) and prompt JSONL files (prompts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import UserError
from .prompts import read_prompt_file, sample_prompts


@dataclass(frozen=True)
class CorpusText:
    text: str
    is_prompt: bool  # a user prompt (wrapped in the chat template) rather than running text


def read_corpus(paths: list[Path]) -> list[CorpusText]:
    """All texts of the given files, validated up front; the bundled sample when none are given."""
    if not paths:
        return [CorpusText(turn, True) for record in sample_prompts() for turn in record.turns]
    texts: list[CorpusText] = []
    for path in paths:
        if not path.is_file():
            raise UserError(f"--from {path}: no such file")
        if path.suffix in (".jsonl", ".json"):
            texts.extend(CorpusText(turn, True) for record in read_prompt_file(path) for turn in record.turns)
            continue
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--from {path}: cannot read it as UTF-8 text ({exc})") from None
        texts.extend(CorpusText(block.strip(), False) for block in content.split("\n\n") if block.strip())
    if not texts:
        raise UserError("--from: the files hold no text")
    return texts
