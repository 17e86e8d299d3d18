"""What one method's run of one turn gives: its tokens, wall time and forward-step count."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..core.events import StepTimings, mean_accepted_tokens


@dataclass(frozen=True)
class Run:
    tokens: list[int]
    seconds: float
    steps: int  # decoding forward passes after the prefill
    timings: StepTimings | None = None  # our decoder's step time split (summed over steps)
    # How many steps emitted 1, 2, 3... tokens (None where a method does not say: HF prompt lookup,
    # llama.cpp's speculation).
    tokens_per_step: Counter[int] | None = None
    drafted: Counter[str] | None = None  # emitted draft tokens by the source that drafted them (ours only)
    verified: Counter[str] | None = None  # draft nodes verified, by the source that proposed them (ours only)
    # Wall time until the first new token (the prefill and its token); None where not measured.
    first_token_seconds: float | None = None

    @property
    def step_tokens(self) -> int:
        """Tokens produced by decoding steps: the prefill's token is not a step's."""
        return max(len(self.tokens) - 1, 0)

    @property
    def mean_accepted_tokens(self) -> float:
        return mean_accepted_tokens(self.step_tokens, self.steps)
