"""Step events and what is measured from them: the one definition of each rate tr reports.

The decode loop yields one StepEvent per forward pass; chat, the live view, bench and `tr generate`
all consume them through `track`, which keeps the tokens, the stats and the wall time. Tokens per
second, MAT and the share of step time spent outside the model's forward are defined here once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields

import torch

from .logprobs import TokenLogprob
from .tree import TreeSpec

# The phases of a decoding step, in order: ask the drafters, run the model, accept, learn.
PHASES = ("draft", "forward", "verify", "update")


def tokens_per_second(tokens: int, seconds: float) -> float:
    """New tokens over wall time; 0 before any time has passed."""
    return tokens / seconds if seconds > 0 else 0.0


def mean_accepted_tokens(step_tokens: int, steps: int) -> float:
    """MAT: tokens emitted per decoding forward after the prefill, counting the bonus token
    (Spec-Bench's convention). 1.0 with no step: one token per forward, no speculation gain."""
    return step_tokens / steps if steps else 1.0


@dataclass(frozen=True)
class StepTimings:
    """Seconds spent in each phase (PHASES) of one step, or summed over steps. On CUDA, forward
    time partly lands in verify (the first host sync)."""

    draft: float = 0.0
    forward: float = 0.0
    verify: float = 0.0
    update: float = 0.0

    @property
    def total(self) -> float:
        return self.draft + self.forward + self.verify + self.update

    @property
    def outside_forward(self) -> float | None:
        """Share of step time spent outside the model's forward (drafting, masks, acceptance,
        matrix update, KV compaction); None when nothing was timed."""
        total = self.total
        return 1.0 - self.forward / total if total > 0 else None

    def __add__(self, other: StepTimings) -> StepTimings:
        return StepTimings(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def seconds_by_phase(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in PHASES}

    def ms_per_step(self, steps: int) -> dict[str, float]:
        """Mean milliseconds per step of each phase."""
        return {name: seconds / steps * 1e3 if steps else 0.0 for name, seconds in self.seconds_by_phase().items()}


@dataclass(frozen=True)
class StepEvent:
    """One forward pass. step 0 is the prefill, which emits the first token and drafts nothing."""

    step: int
    tree_tokens: torch.Tensor | None  # (n+1,) tokens of root + draft nodes, on the CPU
    tree: TreeSpec | None  # the verified tree: every drafter's nodes under one root
    accepted_nodes: list[int]  # node indices of the accepted draft path (root excluded)
    accepted_tokens: list[int]
    bonus: int | None  # the model's own token after the accepted path
    new_tokens: list[int]  # what this step emits, after stop conditions
    timings: StepTimings
    finish_reason: str | None  # "eos", "length", "stop_string" on the last step
    # Emitted draft tokens per source that drafted them (Drafter.name); a node the planner merged
    # from two sources' alike drafts counts for both.
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    # The tree's draft nodes by the source that drafted them: per Drafter.name, its nodes' indices
    # in `tree` (-1 where a planner left one out). Read by the views that colour drafts by source.
    nodes_by_source: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # One per new token when the decoder was asked for them (TokenRecyclingDecoder.set_logprobs).
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # verification forwards (the prefill not counted)
    step_tokens: int = 0  # tokens emitted by those steps (accepted drafts + bonus)
    prefill_seconds: float = 0.0
    first_token_seconds: float | None = None  # wall time until the first new token (the prefill's)
    wall_seconds: float = 0.0
    step_timings: StepTimings = field(default_factory=StepTimings)  # summed over the steps
    finish_reason: str | None = None

    @property
    def mean_accepted_tokens(self) -> float:
        return mean_accepted_tokens(self.step_tokens, self.steps)

    @property
    def tokens_per_second(self) -> float:
        return tokens_per_second(self.new_tokens, self.wall_seconds)

    @property
    def outside_forward(self) -> float | None:
        return self.step_timings.outside_forward

    def add(self, event: StepEvent) -> None:
        self.new_tokens += len(event.new_tokens)
        if event.step == 0:
            self.prefill_seconds += event.timings.total
        else:
            self.steps += 1
            self.step_tokens += len(event.new_tokens)
            self.step_timings = self.step_timings + event.timings
        if event.finish_reason:
            self.finish_reason = event.finish_reason


@dataclass
class GenerationResult:
    tokens: list[int] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    events: list[StepEvent] = field(default_factory=list)


def track(events: Iterable[StepEvent], result: GenerationResult, keep_events: bool = False) -> Iterator[StepEvent]:
    """Pass events through while `result` follows them: its tokens, its stats and the wall time
    since the first event was asked for (the prefill included). The one loop over step events."""
    start = time.perf_counter()
    try:
        for event in events:
            result.tokens.extend(event.new_tokens)
            result.stats.add(event)
            result.stats.wall_seconds = time.perf_counter() - start
            if event.step == 0:
                result.stats.first_token_seconds = result.stats.wall_seconds
            if keep_events:
                result.events.append(event)
            yield event
    finally:  # also when the consumer stops early (Ctrl-C in a chat)
        result.stats.wall_seconds = time.perf_counter() - start
