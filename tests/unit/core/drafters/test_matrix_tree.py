"""draft_tree: the level-wise vectorized gather equals a plain per-node walk of the matrix."""

from __future__ import annotations

import pytest
import torch

from tr_cli.core import PRESETS, TreeBuffers, TreeSpec
from tr_cli.core.drafters.matrix_tree import draft_tree

VOCAB, K = 50, 8


def reference_draft(matrix: torch.Tensor, root: int, spec: TreeSpec) -> list[int]:
    """token[i] = M[token[parent[i]], slot[i]], node by node."""
    rows = matrix.tolist()
    tokens = [root]
    for i in range(1, len(spec.parents)):
        tokens.append(rows[tokens[spec.parents[i]]][spec.slots[i]])
    return tokens


SPECS = [
    PRESETS["paper"],
    TreeSpec.from_paths("small", [[0], [1], [3], [0, 0], [0, 2], [3, 7], [0, 0, 0], [0, 2, 5], [0, 0, 0, 1]]),
    TreeSpec.from_paths("chain", [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_draft_matches_reference(spec, seed):
    g = torch.Generator().manual_seed(seed)
    matrix = torch.randint(0, VOCAB, (VOCAB, K), generator=g, dtype=torch.int32)
    buffers = TreeBuffers.build(spec)
    for root in [0, 7, VOCAB - 1, int(torch.randint(0, VOCAB, (1,), generator=g))]:
        got = draft_tree(matrix, root, buffers)
        assert got.dtype == torch.long
        assert got.shape == (spec.size + 1,)
        assert got.tolist() == reference_draft(matrix, root, spec)


def test_draft_root_as_tensor():
    """The root may be given as a 0-d tensor (as the decoder holds it on device)."""
    spec = SPECS[1]
    matrix = torch.randint(0, VOCAB, (VOCAB, K), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    got = draft_tree(matrix, torch.tensor(11), TreeBuffers.build(spec))
    assert got.tolist() == reference_draft(matrix, 11, spec)


def test_draft_empty_matrix_is_all_zero():
    """A fresh (zero) matrix drafts token 0 everywhere below the root."""
    spec = PRESETS["paper"]
    got = draft_tree(torch.zeros(VOCAB, K, dtype=torch.int32), 9, TreeBuffers.build(spec))
    assert got[0] == 9
    assert got[1:].eq(0).all()


def test_draft_follows_distinct_rows():
    """A matrix where every row is distinct: a node's token depends on its parent's token, not index."""
    # Row t = (t*K + s) % VOCAB: a deterministic but row-specific pattern.
    matrix = torch.tensor([[(t * K + s) % VOCAB for s in range(K)] for t in range(VOCAB)], dtype=torch.int32)
    spec = PRESETS["paper"]
    got = draft_tree(matrix, 3, TreeBuffers.build(spec)).tolist()
    for i in range(1, spec.size + 1):
        assert got[i] == (got[spec.parents[i]] * K + spec.slots[i]) % VOCAB
