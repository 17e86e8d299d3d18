"""The grammar-constrained choice rules: the masked argmax read from the top-k agrees with a full
masked argmax (ties included), and a draft tree is cut to the paths the grammar allows."""

from __future__ import annotations

import pytest
import torch
from set_constraint import SetConstraint

from tr_cli.core.constraint import ConstraintError, allowed_nodes, masked_argmax
from tr_cli.core.tree import EXTERNAL, TreeSpec


def full_masked_argmax(row, allowed):
    mask = torch.zeros(row.shape[0], dtype=torch.bool)
    mask[list(allowed)] = True
    return int(row.masked_fill(~mask, float("-inf")).argmax())


@pytest.mark.parametrize("seed", range(40))
def test_masked_argmax_from_top_k_equals_the_full_one(seed):
    g = torch.Generator().manual_seed(seed)
    vocab = 50
    # Coarse values: many ties, within the top-k and across its edge.
    row = torch.randint(0, 6, (vocab,), generator=g).float()
    allowed = set(torch.randperm(vocab, generator=g)[: int(torch.randint(1, vocab, (), generator=g))].tolist())
    constraint = SetConstraint(lambda path: allowed, vocab)
    values, indices = torch.topk(row, 8)
    assert masked_argmax(row, values.tolist(), indices.tolist(), constraint) == full_masked_argmax(row, allowed)


def test_masked_argmax_refuses_a_dead_end():
    constraint = SetConstraint(lambda path: set(), 10)
    row = torch.arange(10.0)
    values, indices = torch.topk(row, 3)
    with pytest.raises(ConstraintError):
        masked_argmax(row, values.tolist(), indices.tolist(), constraint)


def test_allowed_nodes_cuts_forbidden_nodes_with_their_subtrees():
    # Tokens must go up by one along a path, starting from 1 after the root.
    def rule(path):
        return {path[-1] + 1} if path else {1}

    constraint = SetConstraint(rule, 20)
    #        root
    #      1      5        node 1 (token 1) ok, node 2 (token 5) cut
    #    2   3    6        node 3 ok (2), node 4 cut (3), node 5 under a cut node
    #    3                 node 6 ok (3)
    spec = TreeSpec("t", (-1, 0, 0, 1, 1, 2, 3), (0, 0, 1, 0, 1, 0, EXTERNAL))
    tokens = [0, 1, 5, 2, 3, 6, 3]
    kept = allowed_nodes(spec, tokens, constraint)
    assert kept == [0, 1, 3, 6]
    assert constraint.path == []  # left in the state it started from
    sub = spec.subset(kept)
    assert sub.parents == (-1, 0, 1, 2) and sub.slots == (0, 0, 0, EXTERNAL)
