"""A grammar as a transformers logits processor: constrained `generate`, the reference that
constrained Token Recycling must equal token for token (tests) and the baseline it is timed
against (benchmarks/json_extraction.py)."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from ..core.constraint import TokenConstraint


class GrammarLogitsProcessor(LogitsProcessor):
    """Sets every token the grammar forbids to -inf. Batch size 1; the constraint starts in its
    initial state and follows the tokens `generate` appends after the prompt."""

    def __init__(self, constraint: TokenConstraint, prompt_length: int) -> None:
        self.constraint = constraint
        self.prompt_length = prompt_length
        self.consumed = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != 1:
            raise ValueError("GrammarLogitsProcessor decodes one sequence at a time")
        new = input_ids[0, self.prompt_length + self.consumed :].tolist()
        for token in new:
            self.constraint.advance(token)
        self.consumed += len(new)
        allowed = self.constraint.allowed().to(scores.device)
        masked = scores.clone()
        masked[:, : allowed.shape[0]] = masked[:, : allowed.shape[0]].masked_fill(~allowed, float("-inf"))
        masked[:, allowed.shape[0] :] = float("-inf")
        return masked
