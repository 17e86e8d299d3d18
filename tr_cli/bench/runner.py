"""Run every method on every prompt, interleaved per prompt so machine drift hits all alike."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.events import StepTimings, mean_accepted_tokens, tokens_per_second
from ..core.stopping import context_room
from ..text.conversation import ConversationEncoder, messages_of
from ..text.prompts import PromptRecord
from .distribution import DistributionCheck
from .methods import counterpart, speedup_reference
from .run import Run

if TYPE_CHECKING:
    from ..text.grammar import Grammar


@dataclass
class Measured:
    """One method on one prompt, all turns added up."""

    tokens: list[list[int]] = field(default_factory=list)  # per turn
    seconds: float = 0.0
    steps: int = 0
    step_tokens: int = 0  # tokens produced by decoding steps (each turn's first comes from its prefill)
    check: DistributionCheck | None = None  # sampled runs only
    timings: StepTimings | None = None  # our decoders' step time split, summed over turns
    tokens_per_step: Counter[int] | None = None  # steps by tokens emitted, summed over turns
    drafted: Counter[str] | None = None  # emitted draft tokens by source, summed over turns
    verified: Counter[str] | None = None  # verified draft nodes by source, summed over turns
    first_token_seconds: float | None = 0.0  # summed over turns; None if a turn did not say

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def mean_accepted_tokens(self) -> float:
        return mean_accepted_tokens(self.step_tokens, self.steps)

    def add(self, run: Run) -> None:
        self.tokens.append(run.tokens)
        self.seconds += run.seconds
        self.steps += run.steps
        self.step_tokens += run.step_tokens
        if run.timings is not None:
            self.timings = run.timings if self.timings is None else self.timings + run.timings
        if run.tokens_per_step is not None:
            self.tokens_per_step = (self.tokens_per_step or Counter()) + run.tokens_per_step
        if run.drafted is not None:
            self.drafted = (self.drafted or Counter()) + run.drafted
        if run.verified is not None:
            self.verified = (self.verified or Counter()) + run.verified
        if self.first_token_seconds is not None:
            first = run.first_token_seconds
            self.first_token_seconds = None if first is None else self.first_token_seconds + first


@dataclass
class PromptResult:
    record: PromptRecord
    turns: int
    methods: dict[str, Measured]

    def identical_to_baseline(self, method: str) -> bool | None:
        """Whether `method` gave generate's tokens on the same weights (None: that was not run)."""
        reference = counterpart(method, "baseline")
        if reference not in self.methods:
            return None
        return self.methods[method].tokens == self.methods[reference].tokens


# (input ids, max new tokens, the grammar replies must match or None) -> the run
Runner = Callable[[list[int], int, "Grammar | None"], Run]
EncodeTurn = Callable[[list[tuple[str, str]], str], list[int]]  # (history of (user, reply), new user text) -> ids
Progress = Callable[[int, str, dict[str, float]], None]  # prompt index, method, running speedups
# (method, input ids, generated tokens) -> scores under the distribution of that method's model
Check = Callable[[str, list[int], list[int]], DistributionCheck]


def conversation_turns(encoder: ConversationEncoder, system: str | None = None) -> EncodeTurn:
    """How bench turns a prompt's next turn into ids: the whole conversation so far (the method's
    earlier answers as text) through the one conversation encoder, as `tr chat` would rebuild it."""
    return lambda history, text: encoder.encode(messages_of(history, text, system)).ids


def over_context(
    prompts: list[PromptRecord],
    encode: EncodeTurn,
    max_new_tokens: int,
    turns: str,
    context: int | None,
    max_depth: int,
) -> list[tuple[PromptRecord, int]]:
    """Prompts the model's context cannot hold with every reply at `max_new_tokens` (their last
    turn sees all earlier ones), each with the tokens it would need. Checked before any forward,
    the same for every method: a prompt past the context would run for minutes and compare
    garbage."""
    if context is None:
        return []
    over = []
    for record in prompts:
        texts = record.turns if turns == "all" else record.turns[:1]
        history = [(text, "") for text in texts[:-1]]
        held = len(encode(history, texts[-1])) + (len(texts) - 1) * max_new_tokens
        # Every method needs the whole budget (not a clamped one), or their outputs do not compare.
        if context_room(context, 0, held, max_depth) < max_new_tokens:
            over.append((record, held + max_new_tokens + max_depth))
    return over


def median_run(runner: Runner, ids: list[int], max_new_tokens: int, repeats: int, grammar: Grammar | None) -> Run:
    """Run `repeats` times; the run of median wall time (greedy tokens are the same each time;
    sampled ones differ, and each run is a valid sample)."""
    runs = [runner(ids, max_new_tokens, grammar) for _ in range(repeats)]
    middle = statistics.median_low([r.seconds for r in runs])
    return next(r for r in runs if r.seconds == middle)


def run_bench(
    runners: dict[str, Runner],
    prompts: list[PromptRecord],
    encode: EncodeTurn,
    decode: Callable[[list[int]], str],
    max_new_tokens: int,
    turns: str = "all",
    repeats: int = 1,
    warmup: int = 1,
    progress: Progress | None = None,
    check: Check | None = None,
) -> list[PromptResult]:
    """Multi-turn prompts run turn by turn, each next turn after the method's own answer.
    `check` scores every counted run's tokens (untimed), for the distribution check of sampling."""
    for record in prompts[:warmup]:
        ids = encode([], record.turns[0])
        for runner in runners.values():
            runner(ids, min(max_new_tokens, 32), record.schema)
    results: list[PromptResult] = []
    for index, record in enumerate(prompts):
        texts = record.turns if turns == "all" else record.turns[:1]
        measured = {name: Measured() for name in runners}
        for name, runner in runners.items():
            if progress:
                progress(index, name, running_speedups(results))
            history: list[tuple[str, str]] = []
            for text in texts:
                ids = encode(history, text)
                run = median_run(runner, ids, max_new_tokens, repeats, record.schema)
                measured[name].add(run)
                if check is not None:
                    if measured[name].check is None:
                        measured[name].check = DistributionCheck()
                    measured[name].check.add(check(name, ids, run.tokens))
                history.append((text, decode(run.tokens)))
        results.append(PromptResult(record, len(texts), measured))
    if progress:
        progress(len(prompts), "", running_speedups(results))
    return results


def running_speedups(results: list[PromptResult]) -> dict[str, float]:
    """tokens/s of each method over the reference's (speedup_reference), so far (empty without one)."""
    reference = speedup_reference(results[0].methods) if results else None
    if reference is None:
        return {}

    def rate(name: str) -> float:
        return tokens_per_second(
            sum(r.methods[name].new_tokens for r in results), sum(r.methods[name].seconds for r in results)
        )

    base = rate(reference)
    return {name: rate(name) / base for name in results[0].methods if name != reference and base}
