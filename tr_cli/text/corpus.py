"""Text for `tr matrix init`: plain text files (running text) and prompt JSONL files (prompts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .conversation import encode_prompt
from .prompts import read_prompt_file, read_utf8, sample_prompts, text_blocks


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
        texts.extend(CorpusText(block, False) for block in text_blocks(read_utf8(path, what="--from ")))
    if not texts:
        raise UserError("--from: the files hold no text")
    return texts


def token_lists(tokenizer, texts: list[CorpusText]) -> list[list[int]]:
    """Token ids of each text: prompts as a user turn of the conversation, running text as it is."""
    return [encode_prompt(tokenizer, t.text) if t.is_prompt else list(tokenizer.encode(t.text)) for t in texts]
