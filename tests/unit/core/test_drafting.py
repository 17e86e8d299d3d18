"""The drafting interface: a new draft source plugs into the decoder without touching the loop,
is verified in the same forward pass as the matrix tree, learns where its nodes were and which
were right, and the output stays token for token greedy generation's."""

from __future__ import annotations

import pytest
import torch

from tr_cli.core import PRESETS, StopCondition, TokenRecyclingDecoder, TreeSpec
from tr_cli.core.bounded_cache import BoundedCache
from tr_cli.core.drafters import Draft, Drafter, DraftPlan, Placement, Verification

from tiny_models import EOS, random_prompt, reference, tiny_model


class Oracle(Drafter):
    """Drafts the next tokens of a known continuation (`wrong_every`: every n-th one spoiled)."""

    name = "oracle"

    def __init__(self, continuation: list[int], prompt_length: int, length: int = 4, wrong_every: int = 0) -> None:
        self.continuation, self.prompt_length, self.length, self.wrong_every = (
            continuation,
            prompt_length,
            length,
            wrong_every,
        )
        self.spec = TreeSpec.chain(f"oracle{length}", length)
        self.seen: list[int] = []
        self.learned: list[tuple[Placement | None, list[bool] | None]] = []
        self.proposals = 0

    def propose(self, root: int) -> Draft | None:
        done = len(self.seen) - self.prompt_length  # emitted so far, the root included
        upcoming = self.continuation[done : done + self.length]
        if len(upcoming) < self.length:
            return None
        if self.wrong_every:
            upcoming = [t + 1 if (done + i) % self.wrong_every == 0 else t for i, t in enumerate(upcoming)]
        self.proposals += 1
        return Draft(self.spec, torch.tensor([root, *upcoming]))

    def learn(self, verification: Verification, placement: Placement | None) -> None:
        if verification.tree is None:
            return
        correct = None if placement is None else placement.select(verification.correct).tolist()
        self.learned.append((placement, correct))

    def extend(self, tokens: list[int]) -> None:
        self.seen += tokens

    def reset(self) -> None:
        self.seen = []

    @property
    def max_nodes(self) -> int:
        return self.length

    @property
    def max_depth(self) -> int:
        return self.length

    def describe(self) -> str:
        return f"oracle chain {self.length}"


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2")


def test_a_plugged_in_source_drafts_and_learns(model):
    ids = random_prompt(10, seed=3)
    expected = reference(model, ids, 40)
    oracle = Oracle(expected, len(ids))
    decoder = TokenRecyclingDecoder(model, tree=PRESETS["none"], drafters=[oracle])
    assert decoder.describe() == "tree none (0 nodes) + oracle chain 4"
    result = decoder.generate(ids, StopCondition.build(40, [EOS]), keep_events=True)
    assert result.tokens == expected
    assert oracle.proposals > 0
    # Alone under the root, its nodes are 1..4 of the merged tree, and all of them are right.
    drafted = [(p, c) for p, c in oracle.learned if p is not None]
    assert drafted and all(p.nodes == (1, 2, 3, 4) and all(c) for p, c in drafted)
    # Whole chains accepted: 4 drafted + the bonus per step where it drafted.
    assert result.stats.mean_accepted_tokens > 3
    # The matrix learns from every verified node, the plugged-in source's too.
    assert decoder.matrix[torch.tensor(expected[:20])].any(dim=1).all()


def test_wrong_drafts_beside_the_matrix_tree_change_nothing_but_speed(model):
    ids = random_prompt(12, seed=4)
    expected = reference(model, ids, 40)
    oracle = Oracle(expected, len(ids), length=5, wrong_every=3)
    small = TreeSpec.from_paths("small", [[0], [1], [0, 0]])
    decoder = TokenRecyclingDecoder(
        model, tree=small, drafters=[*DraftPlan.of(small, {"lookup": 3}).drafters("cpu"), oracle]
    )
    result = decoder.generate(ids, StopCondition.build(40, [EOS]), keep_events=True)
    assert result.tokens == expected
    # Placed after the matrix tree (3 nodes) and, when it matched, the lookup chain (1 to 3 nodes).
    starts = {p.nodes[0] for p, _ in oracle.learned if p is not None}
    assert starts <= {4, 5, 6, 7} and starts
    assert any(c is not None and not all(c) for _, c in oracle.learned)  # spoiled tokens are seen as wrong
    trees = {e.tree.name for e in result.events if e.tree is not None}
    lookups = {f"+lookup{n}" for n in (1, 2, 3)} | {""}
    assert trees <= {f"small{lookup}{oracle}" for lookup in lookups for oracle in ("", "+oracle5")}


def test_events_count_emitted_drafts_by_source(model):
    ids = random_prompt(12, seed=4)
    expected = reference(model, ids, 40)
    alone = TokenRecyclingDecoder(model, tree=PRESETS["none"], drafters=[Oracle(expected, len(ids))])
    events = alone.generate(ids, StopCondition.build(40, [EOS]), keep_events=True).events
    # The only source: every emitted draft token is its own.
    assert [e.accepted_by_source.get("oracle", 0) for e in events] == [len(e.accepted_nodes) for e in events]
    assert sum(len(e.accepted_nodes) for e in events) > 10
    assert all(set(e.accepted_by_source) <= {"oracle"} for e in events)

    small = TreeSpec.from_paths("small", [[0], [1], [0, 0]])
    oracle = Oracle(expected, len(ids), length=5, wrong_every=3)
    mixed = TokenRecyclingDecoder(model, tree=small, drafters=[oracle])
    events = mixed.generate(ids, StopCondition.build(40, [EOS]), keep_events=True).events
    # A fixed tree's drafts sit side by side (no merging): each emitted node is one source's.
    for event in events:
        counts = event.accepted_by_source
        assert set(counts) <= {"matrix", "oracle"}
        assert all(n > 0 for n in counts.values())
        assert sum(counts.values()) == len(event.accepted_nodes)
    assert {source for e in events for source in e.accepted_by_source} == {"matrix", "oracle"}


def test_tree_buffers_stay_bounded_while_the_tree_is_redesigned(model):
    from tr_cli.core.design.cost_model import CostModel

    cost = CostModel((1, 8, 32, 128), (0.01, 0.011, 0.02, 0.08))
    decoder = TokenRecyclingDecoder(model, cost=cost, drafters=DraftPlan.of(None, {"lookup": 4}).drafters("cpu"))
    decoder.matrix_tree.auto.every = 1  # redesign after every step
    for seed in range(4):
        decoder.reset()
        decoder.generate(random_prompt(8, seed), StopCondition.build(40, [EOS]))
    assert len(decoder.merge._buffers) <= decoder.merge._buffers.size
    assert len(decoder.matrix_tree._buffers) <= decoder.matrix_tree._buffers.size


def test_bounded_cache_keeps_the_most_recent():
    cache: BoundedCache[int] = BoundedCache(2)
    built = []
    for key in ("a", "b", "a", "c", "b"):
        cache.get(key, lambda key=key: built.append(key) or len(built))
    assert built == ["a", "b", "c", "b"]  # "a" was kept by its second use, "b" dropped for "c"
    assert len(cache) == 2
