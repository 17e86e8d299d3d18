"""What is measured from step events, defined once: tokens/s, MAT, the share of step time outside
the forward, and `track`, the one loop that follows a generation's events."""

from __future__ import annotations

import pytest

from tr_cli.core import GenerationResult, GenerationStats, StepEvent, StepTimings, track
from tr_cli.core.events import PHASES, mean_accepted_tokens, tokens_per_second


def event(step: int, new: list[int], timings: StepTimings, reason: str | None = None) -> StepEvent:
    return StepEvent(
        step=step,
        tree_tokens=None,
        tree=None,
        accepted_nodes=[],
        accepted_tokens=new[:-1],
        bonus=new[-1],
        new_tokens=new,
        timings=timings,
        finish_reason=reason,
    )


def test_rates_and_their_values_with_nothing_measured():
    assert tokens_per_second(30, 1.5) == 20.0
    assert tokens_per_second(30, 0.0) == 0.0
    assert mean_accepted_tokens(9, 3) == 3.0
    assert mean_accepted_tokens(0, 0) == 1.0  # no step: one token per forward, no gain claimed


def test_timings_add_up_and_say_what_lies_outside_the_forward():
    a = StepTimings(draft=1.0, forward=6.0, verify=2.0, update=1.0)
    total = a + StepTimings(forward=10.0)
    assert total == StepTimings(1.0, 16.0, 2.0, 1.0) and total.total == 20.0
    assert total.outside_forward == pytest.approx(0.2)
    assert StepTimings().outside_forward is None
    assert list(total.seconds_by_phase()) == list(PHASES)
    assert total.ms_per_step(4) == {"draft": 250.0, "forward": 4000.0, "verify": 500.0, "update": 250.0}
    assert StepTimings().ms_per_step(0) == dict.fromkeys(PHASES, 0.0)


def test_stats_count_steps_apart_from_the_prefill():
    stats = GenerationStats(prompt_tokens=5)
    stats.add(event(0, [7], StepTimings(forward=0.5)))
    stats.add(event(1, [1, 2, 3], StepTimings(forward=0.1, draft=0.01)))
    stats.add(event(2, [4], StepTimings(forward=0.1, update=0.01), reason="length"))
    assert (stats.new_tokens, stats.steps, stats.step_tokens) == (5, 2, 4)
    assert stats.prefill_seconds == 0.5
    assert stats.mean_accepted_tokens == 2.0
    assert stats.step_timings == StepTimings(draft=0.01, forward=0.2, update=0.01)
    assert stats.finish_reason == "length"


def test_track_follows_the_events_it_passes_on():
    events = [event(0, [7], StepTimings(forward=0.5)), event(1, [1, 2], StepTimings(forward=0.1), "eos")]
    result = GenerationResult()
    seen = [e.step for e in track(iter(events), result, keep_events=True)]
    assert seen == [0, 1]
    assert result.tokens == [7, 1, 2] and result.events == events
    assert result.stats.new_tokens == 3 and result.stats.wall_seconds > 0
    # A consumer that stops early keeps what it saw.
    partial = GenerationResult()
    for _ in track(iter(events), partial):
        break
    assert partial.tokens == [7] and partial.stats.steps == 0
