"""Prompt lookup as a draft source, with branches: what followed the context's tail at its latest
earlier occurrences in this conversation (longest match first), folded into one small tree.

Small models copy their input a lot (translation, summarization, code edits). A recycled-token
tree cannot see the prompt; prompt lookup can, so the two complement each other.
"""

from __future__ import annotations

import torch

from ..design.source_stats import SourceStats
from .continuation_drafter import ContinuationDrafter
from .continuation_tree import Continuation
from .prompt_lookup import DEFAULT_NGRAM, PromptLookup

LOOKUP_BRANCHES = 4  # earlier occurrences folded into one draft
LOOKUP_PRIOR = 0.45


class ConversationLookupDrafter(ContinuationDrafter):
    name = "lookup"

    def __init__(
        self,
        length: int,
        device: torch.device | str = "cpu",
        branches: int = LOOKUP_BRANCHES,
        max_ngram: int = DEFAULT_NGRAM,
        stats: SourceStats | None = None,
    ) -> None:
        super().__init__(length, branches, length * branches, stats or SourceStats(LOOKUP_PRIOR), device)
        self.max_ngram = max_ngram
        self.index = PromptLookup(max_ngram)

    def continuations(self, depth: int, limit: int) -> list[Continuation]:
        return self.index.continuations(depth, limit)

    def extend(self, tokens: list[int]) -> None:
        self.index.extend(tokens)

    def reset(self) -> None:
        self.index = PromptLookup(self.max_ngram)

    def describe(self) -> str:
        return f"lookup {self.depth}x{self.branches}"
