"""tr's per-row top-k (models/row_topk.cpp): torch.topk's values, a fixed order among ties (smaller
index first, NaN above all) so that column 0 is exactly argmax, and verification using it."""

import pytest
import torch

from tr_cli.core.verify import TopCandidates
from tr_cli.models import native_kernels

pytestmark = pytest.mark.usefixtures("tr_kernels")


@pytest.mark.parametrize(("rows", "width", "k"), [(1, 49152, 8), (3, 1000, 8), (40, 4099, 8), (2, 9, 8), (5, 64, 64)])
def test_values_are_torch_topks_and_column_0_is_argmax(rows, width, k):
    """Widths that are not a multiple of 8 (the scalar tail), k = the whole row, and enough rows to
    run in parallel."""
    torch.manual_seed(rows * width + k)
    x = torch.randn(rows, width)
    values, indices = native_kernels.row_topk(x, k)
    want, _ = torch.topk(x, k, dim=-1)
    assert torch.equal(values, want)
    assert torch.equal(torch.gather(x, 1, indices), values)
    assert torch.equal(indices[:, 0], x.argmax(dim=-1))


def test_ties_keep_the_smaller_index_first_even_past_k():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 0.0]])
    values, indices = native_kernels.row_topk(x, 4)
    assert indices.tolist() == [[1, 2, 4, 5]]
    flat = torch.zeros(2, 4099)  # every value ties: the first k indices, whatever the width
    flat[1, 4000] = 1.0
    _, indices = native_kernels.row_topk(flat, 8)
    assert indices[0].tolist() == list(range(8))
    assert indices[1].tolist() == [4000, *range(7)]
    assert torch.equal(indices[:, 0], flat.argmax(dim=-1))


def test_nan_ranks_first_and_minus_zero_ties_with_zero_as_argmax_has_them():
    nan = float("nan")
    x = torch.tensor([[1.0, nan, 5.0, nan, 2.0], [-0.0, 0.0, -1.0, -2.0, -3.0]])
    values, indices = native_kernels.row_topk(x, 3)
    assert indices.tolist() == [[1, 3, 2], [0, 1, 2]]
    assert torch.equal(indices[:, 0], x.argmax(dim=-1))
    minus_inf = torch.full((1, 20), float("-inf"))
    values, indices = native_kernels.row_topk(minus_inf, 3)
    assert indices.tolist() == [[0, 1, 2]] and values.isneginf().all()


def test_operands_it_does_not_take_are_refused():
    with pytest.raises(RuntimeError, match="float32"):
        native_kernels.row_topk(torch.randn(2, 10, dtype=torch.float64), 3)
    with pytest.raises(RuntimeError, match="k must be"):
        native_kernels.row_topk(torch.randn(2, 10), 11)


def test_top_candidates_use_it_only_for_float32_rows():
    x = torch.randn(4, 300)
    top = TopCandidates.of(x, 8, native_kernels.row_topk)
    assert top.first_is_argmax and torch.equal(top.argmax(x), x.argmax(dim=-1))
    half = TopCandidates.of(x.bfloat16(), 8, native_kernels.row_topk)  # torch's, with its tie fix-up
    assert not half.first_is_argmax and torch.equal(half.argmax(x.bfloat16()), x.bfloat16().argmax(dim=-1))
