"""The adjacency matrix helpers: allocation, top-k candidates, row updates and fill counting."""

from __future__ import annotations

import pytest
import torch

from tr_cli.core.matrix import DEFAULT_K, new_matrix, rows_filled, update_rows
from tr_cli.core.verify import TopCandidates


def test_new_matrix_shape_dtype_zeros():
    m = new_matrix(37, 5)
    assert m.shape == (37, 5)
    assert m.dtype == torch.int32
    assert m.device.type == "cpu"
    assert not m.any()
    assert new_matrix(10).shape == (10, DEFAULT_K)


@pytest.mark.parametrize("vocab, k", [(0, 8), (-1, 8), (10, 0), (10, -3)])
def test_new_matrix_rejects_non_positive(vocab, k):
    with pytest.raises(ValueError):
        new_matrix(vocab, k)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_top_candidates_best_first(k):
    """Each row's ids are the k largest logits in descending order (reference: Python sort)."""
    g = torch.Generator().manual_seed(k)
    n, vocab = 6, 40
    # Distinct values per row, so the ordering is unambiguous.
    logits = torch.stack([torch.randperm(vocab, generator=g).float() / 7 - 2 for _ in range(n)])
    got = TopCandidates.of(logits, k).indices
    assert got.shape == (n, k)
    for row, ids in zip(logits.tolist(), got.tolist(), strict=True):
        expected = sorted(range(vocab), key=lambda t: row[t], reverse=True)[:k]
        assert ids == expected


def test_top_candidates_half_precision():
    """Works on fp16/bf16 logits as the model produces them."""
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0], [5.0, 4.0, 6.0, -2.0]])
    for dtype in (torch.float16, torch.bfloat16):
        assert TopCandidates.of(logits.to(dtype), 2).indices.tolist() == [[1, 3], [2, 0]]


def test_update_rows_overwrites_only_given_rows():
    g = torch.Generator().manual_seed(0)
    vocab, k = 30, 4
    m = torch.randint(1, vocab, (vocab, k), generator=g, dtype=torch.int32)
    before = m.clone()
    rows = torch.tensor([3, 17, 0, 29])
    cands = torch.randint(0, vocab, (4, k), generator=g, dtype=torch.int32)
    update_rows(m, rows, cands)
    touched = set(rows.tolist())
    for t in range(vocab):
        if t in touched:
            i = rows.tolist().index(t)
            assert m[t].tolist() == cands[i].tolist(), t
        else:
            assert m[t].tolist() == before[t].tolist(), t


def test_update_rows_accepts_int64_tokens_and_other_dtypes():
    """Tokens may be long (tree tokens) and candidates int32 (TopCandidates.indices): dtype is kept."""
    m = new_matrix(10, 3)
    update_rows(m, torch.tensor([4], dtype=torch.long), torch.tensor([[9, 8, 7]], dtype=torch.int32))
    assert m.dtype == torch.int32
    assert m[4].tolist() == [9, 8, 7]


def test_update_rows_repeated_token():
    """The same token twice in one update: its row ends up equal to one of the provided rows."""
    m = new_matrix(12, 3)
    rows = torch.tensor([5, 2, 5, 5])
    cands = torch.tensor([[1, 2, 3], [4, 4, 4], [7, 8, 9], [10, 11, 1]], dtype=torch.int32)
    update_rows(m, rows, cands)
    assert m[5].tolist() in ([1, 2, 3], [7, 8, 9], [10, 11, 1])
    assert m[2].tolist() == [4, 4, 4]
    others = [t for t in range(12) if t not in (2, 5)]
    assert not m[others].any()


def test_rows_filled():
    """Counts rows with any non-zero candidate (an all-zero row is empty)."""
    m = new_matrix(20, 4)
    assert rows_filled(m) == 0
    m[3, 2] = 5
    m[7] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    m[19, 0] = 1
    expected = sum(1 for row in m.tolist() if any(row))
    assert rows_filled(m) == expected == 3
    update_rows(m, torch.tensor([0, 3]), torch.tensor([[6, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.int32))
    assert rows_filled(m) == 3  # row 0 filled, row 3 cleared
