"""Prompt lookup: n-gram index proposals (one or several continuations), trees carrying its nodes,
drafting and verifying them."""

from __future__ import annotations

import pytest
import torch

from tr_cli.core.drafters import ConversationLookupDrafter, DraftMerger, MatrixTreeDrafter, draft_tree
from tr_cli.core.drafters.continuation_tree import Continuation, fold
from tr_cli.core.drafters.prompt_lookup import PromptLookup
from tr_cli.core.tree import EXTERNAL, PRESETS, TreeSpec
from tr_cli.core.tree_buffers import TreeBuffers
from tr_cli.core.verify import greedy_accept


def lookup_over(tokens: list[int], **kw) -> PromptLookup:
    index = PromptLookup(**kw)
    index.extend(tokens)
    return index


def test_proposes_the_continuation_of_the_latest_longest_match():
    #        0  1  2  3  4  5  6  7  8  9 10
    seq = [5, 6, 7, 8, 9, 1, 6, 7, 2, 5, 6, 7]
    # Tail (5, 6, 7) occurred at 0..2 and was followed by 8, 9, 1, ...
    assert lookup_over(seq).propose(4) == [8, 9, 1, 6]
    # Only bigrams: (6, 7) last ended at 7, followed by 2, 5, 6, 7.
    assert lookup_over(seq, max_ngram=2).propose(3) == [2, 5, 6]


def test_falls_back_to_shorter_ngrams_and_returns_nothing_without_a_match():
    assert lookup_over([1, 2, 3, 4, 9, 4]).propose(5) == [9, 4]  # only the unigram (4) matches
    assert lookup_over([1, 2, 3, 4]).propose(5) == []
    assert lookup_over([1, 2, 3, 4], min_ngram=2).propose(5) == []
    assert PromptLookup().propose(3) == []


def test_incremental_extension_equals_building_at_once():
    seq = torch.randint(0, 6, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    grown = PromptLookup()
    for i, token in enumerate(seq):
        grown.extend([token])
        assert grown.propose(6) == lookup_over(seq[: i + 1]).propose(6)


def test_proposal_is_a_true_earlier_continuation():
    seq = torch.randint(0, 5, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    index = lookup_over(seq)
    proposal = index.propose(8)
    assert proposal
    # Some earlier position ends with the tail trigram and is followed by exactly the proposal.
    starts = [e for e in range(2, len(seq) - 1) if seq[e - 2 : e + 1] == seq[-3:]]
    assert any(seq[e + 1 : e + 1 + len(proposal)] == proposal for e in starts)


def test_bad_ngram_sizes_raise():
    with pytest.raises(ValueError):
        PromptLookup(max_ngram=2, min_ngram=3)


SMALL = TreeSpec.from_paths("small", [[0], [1], [0, 0], [1, 0]])


def with_chain(spec: TreeSpec, length: int) -> TreeSpec:
    return TreeSpec.merge([spec, TreeSpec.chain(f"lookup{length}", length)])


def test_merge_appends_the_chain_under_the_root():
    spec = with_chain(SMALL, 3)
    assert spec.name == "small+lookup3"
    assert spec.parents == SMALL.parents + (0, 5, 6)
    assert spec.slots[-3:] == (EXTERNAL,) * 3
    assert (spec.external_size, spec.matrix_size, spec.size) == (3, 4, 7)
    assert spec.depth == 3 and spec.depths[-3:] == (1, 2, 3)
    assert (spec.parents[:5], spec.slots[:5]) == (SMALL.parents, SMALL.slots)
    assert spec.paths() == SMALL.paths()
    assert TreeSpec.merge([SMALL]) is SMALL
    with pytest.raises(ValueError):  # no matrix node may follow another drafter's nodes
        TreeSpec(spec.name, spec.parents + (1,), spec.slots + (2,))


def test_buffers_keep_matrix_levels_and_the_chain_apart():
    buffers = TreeBuffers.build(with_chain(SMALL, 3))
    assert buffers.level_slices == ((1, 3), (3, 5))
    assert buffers.matrix_nodes.tolist() == [1, 2, 3, 4]
    assert buffers.depth == 3
    # The chain's deepest node sees the root and its two chain ancestors, no matrix node.
    assert buffers.ancestor_mask[7].nonzero().flatten().tolist() == [0, 5, 6, 7]
    assert buffers.leaf_paths.tolist()[-1] == [5, 6, 7]


def test_several_continuations_longest_match_first_then_latest():
    #      0  1  2  3  4  5  6  7  8  9 10 11 12
    seq = [1, 2, 3, 4, 9, 2, 3, 5, 7, 3, 6, 2, 3]
    found = lookup_over(seq, max_ngram=3).continuations(2, limit=4)
    # (2, 3) ended at 2 and 6: the latest first; then the unigram (3) at 9 (2 and 6 already taken).
    assert found == [Continuation(2, (5, 7)), Continuation(2, (4, 9)), Continuation(1, (6, 2))]
    assert lookup_over(seq, max_ngram=3).continuations(2, limit=1) == found[:1]


def test_folded_continuations_branch_on_distinct_first_tokens():
    tree = fold(
        [Continuation(3, (5, 6, 7)), Continuation(3, (5, 6, 8)), Continuation(2, (9, 1)), Continuation(1, (5, 2))],
        max_nodes=5,
    )
    # Root children 5 (3 of 4 continuations) and 9; under 5: 6 (2 of 3), then 2; under 6: 7 first.
    assert tree.tokens[1:] == (5, 6, 9, 7, 2) or tree.size == 5
    by_path = {}
    for i in range(1, tree.size + 1):
        by_path[i] = (by_path.get(tree.parents[i], ()) + (tree.tokens[i],)) if tree.parents[i] else (tree.tokens[i],)
    paths = set(by_path.values())
    assert {(5,), (9,), (5, 6)} <= paths and len(paths) == 5
    share = {by_path[i]: tree.share[i] for i in by_path}
    assert share[(5,)] == 0.75 and share[(9,)] == 0.25 and share[(5, 6)] == 2 / 3
    assert all(tree.parents[i] < i for i in range(1, tree.size + 1))


def test_lookup_drafter_proposes_a_priced_tree_and_learns_where_it_was_right():
    drafter = ConversationLookupDrafter(4, branches=2)
    assert drafter.propose(3) is None  # nothing seen yet: no draft
    drafter.extend([3, 11, 12, 13, 3, 20, 21, 3])  # the root (pending token) ends the conversation
    draft = drafter.propose(3)
    # Two continuations of (3): 20 21 3 (latest) and 11 12 13 3, so the root gets two branches.
    assert draft.tokens[0] == 3 and sorted(draft.tokens[1:].tolist()) == sorted([20, 21, 3, 11, 12, 13, 3])
    assert all(s == EXTERNAL for s in draft.spec.slots[1:])
    p = draft.probabilities
    assert len(p) == draft.spec.size and all(0 < x < 1 for x in p)
    assert all(p[i - 1] <= (p[draft.spec.parents[i] - 1] if draft.spec.parents[i] else 1) for i in range(1, 8))
    before = drafter.stats.observed
    buffers = TreeBuffers.build(draft.spec)
    correct = torch.zeros(draft.spec.size + 1, dtype=torch.bool)
    first = draft.tokens.tolist().index(11)
    correct[first] = correct[first + 1] = True  # 11 and 12 right, 13 wrong
    from tr_cli.core.drafters import Placement, Verification

    verification = Verification(draft.tokens, torch.zeros(8, 8, dtype=torch.long), correct, buffers)
    drafter.learn(verification, Placement.contiguous(1, draft.spec.size))
    # Tried: both first nodes, 12 (after 11), 13 (after 12); not 21 (20 was wrong), not the last 3s.
    assert drafter.stats.observed - before == 4
    assert sum(drafter.stats.hits) == 2
    drafter.reset()
    assert drafter.propose(3) is None


def test_merged_draft_is_the_matrix_tree_then_the_lookup():
    matrix = torch.arange(40 * 8, dtype=torch.int32).view(40, 8) % 40
    tree, lookup = MatrixTreeDrafter(matrix, SMALL), ConversationLookupDrafter(4, branches=1)
    lookup.extend([3, 11, 12, 13, 14, 3])
    buffers, tokens, placements = DraftMerger("cpu").plan(3, [tree.propose(3), lookup.propose(3)])
    assert buffers.spec == with_chain(SMALL, 4)
    assert tokens[:5].tolist() == draft_tree(matrix, 3, TreeBuffers.build(SMALL)).tolist()
    assert tokens[5:].tolist() == [11, 12, 13, 14]
    assert [p.nodes for p in placements] == [(1, 2, 3, 4), (5, 6, 7, 8)]


def test_verification_prefers_a_longer_lookup_chain():
    spec = with_chain(PRESETS["paper"], 5)
    buffers = TreeBuffers.build(spec)
    n1 = spec.size + 1
    tokens = torch.full((n1,), 7, dtype=torch.long)
    tokens[0] = 1
    chain = list(range(spec.matrix_size + 1, n1))
    for i, node in enumerate(chain):
        tokens[node] = 20 + i
    logits = torch.zeros(n1, 64)
    logits[0, 20] = 1  # the root's choice is the chain's first token
    for i, node in enumerate(chain[:-1]):
        logits[node, 21 + i] = 1  # ... and each chain node predicts the next
    logits[chain[-1], 40] = 1
    logits[1 : chain[0], 9] = 1  # matrix nodes (all token 7) never match anything
    acc = greedy_accept(tokens, logits, buffers)
    assert acc.nodes == chain
    assert acc.tokens == [20, 21, 22, 23, 24]
    assert acc.bonus == 40
