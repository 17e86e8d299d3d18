"""Designing the tree for a device: the cost model, acceptance statistics and the designer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tr_cli.core import TreeBuffers, TreeSpec
from tr_cli.core.design import cost_model
from tr_cli.core.design.acceptance_stats import AcceptanceStats
from tr_cli.core.design.cost_model import CostModel, calibrate
from tr_cli.core.design.tree_design import AutoTree, best_paths, design_tree


def test_cost_model_interpolates_and_extends():
    cost = CostModel((1, 9, 17), (0.010, 0.020, 0.024))
    assert cost.time(1) == pytest.approx(0.010)
    assert cost.time(5) == pytest.approx(0.015)
    assert cost.time(13) == pytest.approx(0.022)
    assert cost.time(25) == pytest.approx(0.028)  # the last segment goes on
    assert cost.time(0) == pytest.approx(0.010)
    assert CostModel.from_dict(json.loads(json.dumps(cost.to_dict()))) == cost


@pytest.mark.parametrize(
    "sizes, seconds", [((1,), (0.1,)), ((2, 1), (0.1, 0.2)), ((1, 2), (0.1, 0.0)), ((0, 2), (0.1, 0.2))]
)
def test_cost_model_rejects_bad_points(sizes, seconds):
    with pytest.raises(ValueError):
        CostModel(sizes, seconds)


def test_calibrate_prices_sizes_by_their_median_ratio_to_a_one_token_step(monkeypatch):
    """On a fake clock that each step advances by a set time: the first round is quiet and the two
    others run 1.5x slower (a busy machine), size 8 hiccups (+30 ms) in the quiet round, and size 4
    is faster than size 2 (noise the curve must not keep). Fastest-of-repeats per size would put
    t(8) at 30 ms (a slow round's) over a quiet round's t(1) of 10 ms: 3x where the step is 2x."""
    step_seconds = {1: 0.010, 2: 0.012, 4: 0.011, 8: 0.020}
    clock = [0.0]
    calls: list[int] = []

    def run(n: int) -> None:
        calls.append(n)
        call = len(calls) - 1
        slow = 1.5 if call >= 1 + 6 + 6 else 1.0  # after the warmup, the probe and the first round
        clock[0] += step_seconds[n] * slow + (0.03 if call == 1 + 6 + 5 else 0.0)

    monkeypatch.setattr(cost_model, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    cost = calibrate(run, sizes=(1, 2, 4, 8), repeats=3, warmup=1)
    # warmup, a probe up the sizes (untimed), then pairs, round-robin
    assert calls == [1] + [1, 2, 1, 4, 1, 8] * 4
    # Ratios 1.2, 1.1 (lifted to 1.2) and 2 (median of 5, 2, 2) times the quiet t(1).
    assert cost.sizes == (1, 2, 4, 8)
    assert cost.seconds == pytest.approx((0.010, 0.012, 0.012, 0.020), abs=1e-12)


def test_calibrate_stops_at_the_first_size_as_dear_as_the_steepest_ratio(monkeypatch):
    """Sizes past the first that costs `steepest` one-token steps are never run; the curve goes on
    in a straight line from the last two sizes timed."""
    step_seconds = {1: 0.010, 2: 0.030, 4: 0.130, 8: 0.200, 16: 0.400}
    clock = [0.0]
    calls: list[int] = []

    def run(n: int) -> None:
        calls.append(n)
        clock[0] += step_seconds[n]

    monkeypatch.setattr(cost_model, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    cost = calibrate(run, sizes=(1, 2, 4, 8, 16), repeats=2, warmup=1, steepest=12.0)
    assert 8 not in calls and 16 not in calls
    assert cost.sizes == (1, 2, 4)
    assert calls[:7] == [1, 1, 2, 1, 4, 1, 4]  # the steep pair timed again before the cut
    assert cost.time(8) == pytest.approx(0.130 + (0.130 - 0.030) / 2 * 4)
    # One pause of the machine during a probe step is no cut: size 2 hiccups once (+1 s).
    calls.clear()
    hiccup = [True]

    def paused(n: int) -> None:
        run(n)
        if n == 2 and hiccup[0]:
            clock[0] += 1.0
            hiccup[0] = False

    monkeypatch.setattr(cost_model, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    assert calibrate(paused, sizes=(1, 2, 4, 8, 16), repeats=1, warmup=0, steepest=12.0).sizes == (1, 2, 4)
    # A curve that never gets that steep is timed at every size.
    assert calibrate(run, sizes=(1, 2, 4, 8, 16), repeats=1, warmup=0, steepest=100.0).sizes == (1, 2, 4, 8, 16)


def brute_force_expected(spec: TreeSpec, p: list[list[float]]) -> float:
    """1 + sum over nodes of the product of p along the node's path."""
    total = 1.0
    for path in spec.paths():
        prob = 1.0
        for d, s in enumerate(path):
            prob *= p[d][s]
        total += prob
    return total


P = [[0.5, 0.2, 0.1, 0.05], [0.6, 0.2, 0.1, 0.05], [0.7, 0.2, 0.05, 0.02]]


def test_best_paths_are_ordered_and_form_a_tree():
    ranked = best_paths(P, 4, 30)
    probs = [prob for prob, _ in ranked]
    assert probs == sorted(probs, reverse=True)
    seen = set()
    for _, path in ranked:
        assert path[:-1] == () or path[:-1] in seen  # parents come first
        seen.add(path)
    assert ranked[0] == (0.5, (0,))
    assert ranked[1][1] == (0, 0) and ranked[1][0] == pytest.approx(0.3)


def test_design_is_the_best_tree_of_its_size_and_size_follows_the_cost():
    flat = CostModel((1, 200), (0.010, 0.0101))  # nodes nearly free: take many
    steep = CostModel((1, 2, 200), (0.010, 0.020, 2.0))  # every node doubles the cost: take few
    big = design_tree(P, flat, 4, max_nodes=40)
    small = design_tree(P, steep, 4, max_nodes=40)
    assert big.spec.size == 40
    assert small.spec.size < 4
    for design in (big, small):
        assert design.expected_tokens == pytest.approx(brute_force_expected(design.spec, P))
    # No other tree of the same size does better: random 6-node trees grown node by node.
    best6 = design_tree(P, CostModel((1, 7, 8), (0.01, 0.01, 10.0)), 4, max_nodes=6)
    assert best6.spec.size == 6
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        nodes: list[tuple[int, ...]] = []
        while len(nodes) < 6:
            frontier = [q + (s,) for q in [()] + nodes if len(q) < len(P) for s in range(4) if q + (s,) not in nodes]
            nodes.append(frontier[int(torch.randint(len(frontier), (1,), generator=g))])
        other = TreeSpec.from_paths("other", [list(q) for q in nodes])
        assert brute_force_expected(other, P) <= best6.expected_tokens + 1e-12


def test_statistics_count_trials_only_where_the_path_was_right():
    spec = TreeSpec.from_paths("t", [[0], [1], [0, 0], [0, 1], [1, 0]])  # nodes 1..5
    buffers = TreeBuffers.build(spec)
    stats = AcceptanceStats(k=2, max_depth=3)
    # Node 1 right, node 2 wrong; under node 1: node 3 wrong, node 4 right; node 5 (under 2) right.
    correct = torch.tensor([True, True, False, False, True, True])
    stats.record(buffers, correct, context=2)  # drafted after a step that accepted 2+
    table = stats.to_dict()
    assert table["trials"][2][0] == [1, 1]  # both depth-1 nodes tried
    assert table["hits"][2][0] == [1, 0]
    assert table["trials"][2][1] == [1, 1]  # node 3 and 4 (parent right); node 5's parent was wrong
    assert table["hits"][2][1] == [0, 1]
    assert table["trials"][0] == table["trials"][1] == [[0, 0]] * 3  # other contexts untouched
    assert stats.observed_steps == 1
    # Probabilities of that context move from the prior toward the counts; the others stay.
    before = AcceptanceStats(k=2, max_depth=3).probabilities(2)
    after = stats.probabilities(2)
    assert after[0][0] > before[0][0] and after[0][1] < before[0][1]
    assert stats.probabilities(0) == before


def test_statistics_round_trip_and_reject_bad_tables():
    stats = AcceptanceStats(k=2, max_depth=2)
    stats.load_dict({"k": 2, "hits": [[3, 1], [2, 0]], "trials": [[10, 10], [4, 1]]})
    again = AcceptanceStats(k=2, max_depth=2)
    again.load_dict(json.loads(json.dumps(stats.to_dict())))
    assert again.to_dict() == stats.to_dict()
    with pytest.raises(ValueError):
        again.load_dict({"k": 3, "hits": [], "trials": []})
    # A table saved before contexts existed counts for each context.
    assert again.to_dict()["trials"] == [[[10, 10], [4, 1]]] * 3
    with pytest.raises(ValueError):
        again.load_dict({"k": 2, "hits": [[5, 0]], "trials": [[4, 0]]})  # more hits than trials
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            again.load_dict({"k": 2, "hits": [[1, 0]], "trials": [[bad, 0]]})


def test_auto_tree_redesigns_from_new_statistics():
    stats = AcceptanceStats(k=4, max_depth=4)
    cost = CostModel((1, 4, 64), (0.010, 0.0105, 0.05))
    auto = AutoTree(stats, cost, k=4, every=2)
    first = auto.spec
    # Teach it that only slot 0 is ever right, at every depth: the tree becomes a deep chain.
    chain = TreeSpec.from_paths("chain", [[0] * d for d in range(1, 5)])
    buffers = TreeBuffers.build(chain)
    for _ in range(500):
        stats.record(buffers, torch.ones(5, dtype=torch.bool))
    assert auto.after_step() == first  # not yet: every=2
    second = auto.after_step()
    assert second != first
    assert second.depth == 4
