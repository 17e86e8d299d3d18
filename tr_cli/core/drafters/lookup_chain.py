"""Prompt lookup as a draft source: one chain under the root with what followed the context's tail
the last time it occurred, topped up along the matrix's first candidates.

Small models copy their input a lot (translation, summarization, code edits). A recycled-token
tree cannot see the prompt; prompt lookup can, so the two complement each other.
"""

from __future__ import annotations

import torch

from ..tree import TreeSpec
from .base import Draft, Drafter
from .prompt_lookup import DEFAULT_NGRAM, PromptLookup

DEFAULT_LOOKUP_LENGTH = 10  # nodes of the chain when a designed tree drafts one


class LookupChainDrafter(Drafter):
    def __init__(self, length: int, matrix: torch.Tensor, max_ngram: int = DEFAULT_NGRAM) -> None:
        if length < 1:
            raise ValueError(f"a lookup chain needs at least one node, got {length}")
        self.length = length
        self.matrix = matrix
        self.max_ngram = max_ngram
        self.spec = TreeSpec.chain(f"lookup{length}", length)
        self.index = PromptLookup(max_ngram)

    def propose(self, root: int) -> Draft | None:
        given = self.index.propose(self.length)
        if not given:
            return None
        head = torch.tensor([root, *given], dtype=torch.long, device=self.matrix.device)
        if len(given) == self.length:
            return Draft(self.spec, head)
        # Past the match, guessing the matrix's first candidate costs nothing extra to verify
        # (gathered on the device: no host sync per node).
        tokens = torch.empty(self.length + 1, dtype=torch.long, device=self.matrix.device)
        tokens[: len(head)] = head
        for i in range(len(head), self.length + 1):
            tokens[i] = self.matrix[tokens[i - 1], 0]
        return Draft(self.spec, tokens)

    def extend(self, tokens: list[int]) -> None:
        self.index.extend(tokens)

    def reset(self) -> None:
        self.index = PromptLookup(self.max_ngram)

    @property
    def max_nodes(self) -> int:
        return self.length

    @property
    def max_depth(self) -> int:
        return self.length

    def describe(self) -> str:
        return f"lookup chain {self.length}"
