"""Prompt sets: the bundled Spec-Bench sample (bench will read user files here too)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class PromptRecord:
    id: str
    category: str
    turns: tuple[str, ...]


def sample_prompts() -> list[PromptRecord]:
    """The prompts shipped with tr (a small Spec-Bench sample)."""
    text = resources.files("tr_cli.data").joinpath("sample_prompts.jsonl").read_text(encoding="utf-8")
    records = []
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            records.append(PromptRecord(str(row["question_id"]), row["category"], tuple(row["turns"])))
    return records
