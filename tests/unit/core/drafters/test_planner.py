"""The per-step planner: every source's nodes priced against the measured cost of verifying them."""

from __future__ import annotations

import torch

from tr_cli.core.design.cost_model import CostModel
from tr_cli.core.drafters import Draft
from tr_cli.core.drafters.planner import DraftPlanner
from tr_cli.core.tree import EXTERNAL, TreeSpec

MATRIX = TreeSpec.from_paths("m", [[0], [1], [0, 0]])  # nodes: 1=(0) 2=(1) 3=(0,0)


def matrix_draft(tokens: list[int], probabilities: tuple[float, ...]) -> Draft:
    return Draft(MATRIX, torch.tensor(tokens), probabilities=probabilities)


def chain_draft(tokens: list[int], probabilities: tuple[float, ...] | None) -> Draft:
    return Draft(TreeSpec.chain(f"lookup{len(tokens) - 1}", len(tokens) - 1), torch.tensor(tokens), None, probabilities)


def test_nodes_that_do_not_pay_are_left_out():
    # Each node past the first costs a lot: only very likely nodes pay.
    steep = CostModel((1, 2, 3, 8), (1.0, 1.2, 2.0, 8.0))
    planner = DraftPlanner(steep, "cpu")
    drafts = [matrix_draft([9, 10, 11, 12], (0.6, 0.1, 0.3)), chain_draft([9, 20, 21], (0.05, 0.04))]
    buffers, tokens, placements = planner.plan(9, drafts)
    # Node 1 (0.6): 1.6 / 1.2 > 1 / 1; then node 3 (0.3) at t(3) = 2.0: 1.9 / 2.0 < 1.6 / 1.2.
    assert tokens.tolist() == [9, 10]
    assert placements[0].nodes == (1, -1, -1)
    assert placements[1].nodes == (-1, -1)  # the weak source gets nothing
    assert buffers.spec.size == 1 and abs(planner.last_expected - 1.6) < 1e-9


def test_a_sure_lookup_crowds_in_and_duplicates_are_verified_once():
    flat = CostModel((1, 16), (1.0, 1.05))
    planner = DraftPlanner(flat, "cpu")
    # The lookup's first token equals the matrix's first candidate (10): one node for both.
    drafts = [matrix_draft([9, 10, 11, 12], (0.5, 0.1, 0.2)), chain_draft([9, 10, 30, 31], (0.9, 0.8, 0.7))]
    buffers, tokens, placements = planner.plan(9, drafts)
    spec = buffers.spec
    assert placements[1].nodes[0] == placements[0].nodes[0] == 1
    assert tokens.tolist()[:4] == [9, 10, 11, 12]  # matrix nodes first, in level order
    assert spec.slots[1:4] == (0, 1, 0)
    # The lookup's 30, 31 hang under the shared node 1 (token 10), after the matrix nodes.
    assert tokens.tolist()[4:] == [30, 31] and spec.slots[4:] == (EXTERNAL, EXTERNAL)
    assert spec.parents[4:] == (1, 4)
    assert placements[1].nodes == (1, 4, 5)
    assert spec.size == 5  # 6 proposed nodes, one shared


def test_unpriced_drafts_are_verified_whole():
    planner = DraftPlanner(CostModel((1, 2), (1.0, 100.0)), "cpu")
    buffers, tokens, placements = planner.plan(9, [chain_draft([9, 5, 6], None)])
    assert tokens.tolist() == [9, 5, 6] and placements[0].nodes == (1, 2)


def test_the_planner_corrects_itself_from_what_steps_cost_and_accept():
    planner = DraftPlanner(CostModel((1, 8), (1.0, 1.5)), "cpu")
    drafts = [matrix_draft([9, 10, 11, 12], (0.5, 0.2, 0.3))]
    _, tokens, _ = planner.plan(9, drafts)
    assert len(tokens) == 4  # 2.0 expected over t(4) ~ 1.21 beats 1 over 1.0
    # Its drafts turn out never right, and its steps cost twice the calibration: it stops drafting.
    drafted = 0
    for _ in range(60):
        _, tokens, _ = planner.plan(9, drafts)
        size = len(tokens)
        drafted += size > 1
        # Plain steps cost what the calibration says; they teach only the one-token ratio.
        planner.observe(seconds=2 * planner.cost.time(size) if size > 1 else 1.0, accepted=0, verified=size - 1)
    assert 0 < drafted < 10 and planner.gain.value < 0.8 and planner.step_time.value > 1.3  # it learned fast
    assert abs(planner.plain_time.value - 1.0) < 1e-9
    _, tokens, placements = planner.plan(9, drafts)
    assert tokens.tolist() == [9] and placements[0].nodes == (-1, -1, -1)


def test_a_calibration_that_overrates_plain_steps_is_found_out_and_both_prices_stay_measured():
    # t(1) was calibrated at 2.0 (under load, say) and a real one-token step costs 1.0; drafted steps
    # cost what the calibration says. Drafting 3 nodes looks worth it (1.5 expected over t(4) ~ 2.17
    # against 1 over 2.0) and is not (1 token a second without drafts): only a plain step shows it.
    planner = DraftPlanner(CostModel((1, 8), (2.0, 2.4)), "cpu")
    drafts = [matrix_draft([9, 10, 11, 12], (0.3, 0.1, 0.1))]
    sizes = []
    for step in range(300):
        _, tokens, _ = planner.plan(9, drafts)
        size = len(tokens)
        sizes.append(size)
        seconds = planner.cost.time(size) if size > 1 else 1.0
        planner.observe(seconds, accepted=step % 2 if size > 1 else 0, verified=size - 1)  # 0.5 a step, as planned
    assert sizes[0] == 4
    late = sizes[-150:]
    assert late.count(1) >= 140, late  # it stopped drafting
    assert any(size > 1 for size in late)  # and still tries a drafted step now and then
    assert 0.4 < planner.plain_time.value < 0.65
