"""Text for `tr matrix init`: plain text files (running text) and prompt JSONL files (prompts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .conversation import encode_prompt
from .input_text import UnreadableText, read_text_file
from .prompts import read_prompt_file, sample_prompts, text_blocks


class CorpusError(UserError):
    """A corpus file that cannot be read, or files that hold no text. It names the file (`path`;
    None: the files together) and what is wrong (`reason`), not how the files were given: the
    caller says that."""

    def __init__(self, path: Path | None, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path is not None else reason)


@dataclass(frozen=True)
class CorpusText:
    text: str
    is_prompt: bool  # a user prompt (wrapped in the chat template) rather than running text


def read_corpus(paths: list[Path]) -> list[CorpusText]:
    """All texts of the given files, validated up front; the bundled sample when none are given.
    CorpusError for a file that is not there or not text, or files without text; a prompt file's
    own errors name its line (text/prompts.py)."""
    if not paths:
        return [CorpusText(turn, True) for record in sample_prompts() for turn in record.turns]
    texts: list[CorpusText] = []
    for path in paths:
        # Not is_file(): a FIFO (`--from <(...)`) or a device is read as it comes, up to the limit.
        if not path.exists():
            raise CorpusError(path, "no such file")
        if path.is_dir():
            raise CorpusError(path, "is a folder; name a text or prompt file")
        if path.suffix in (".jsonl", ".json"):
            texts.extend(CorpusText(turn, True) for record in read_prompt_file(path) for turn in record.turns)
            continue
        texts.extend(CorpusText(block, False) for block in text_blocks(_read_text(path)))
    if not texts:
        raise CorpusError(None, "the files hold no text")
    return texts


def _read_text(path: Path) -> str:
    try:
        return read_text_file(path)
    except UnreadableText as exc:
        raise CorpusError(path, exc.reason) from None


def token_lists(tokenizer, texts: list[CorpusText]) -> list[list[int]]:
    """Token ids of each text: prompts as a user turn of the conversation, running text as it is."""
    return [encode_prompt(tokenizer, t.text) if t.is_prompt else list(tokenizer.encode(t.text)) for t in texts]
