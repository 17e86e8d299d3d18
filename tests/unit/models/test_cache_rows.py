"""tr's KV compaction (models/cache_rows.cpp): every layer's accepted rows moved in one call, the
same cache as the tensor ops' compaction, and bad rows refused."""

import pytest
import torch

from tr_cli.core.kv_cache import CompactingCache
from tr_cli.models import native_kernels

pytestmark = pytest.mark.usefixtures("tr_kernels")


def filled(keep_rows, length: int = 300) -> CompactingCache:
    """Three layers of (1, 2 heads, length, 8) random keys and values (past the first capacity)."""
    cache = CompactingCache(keep_rows)
    g = torch.Generator().manual_seed(1)
    for layer in range(3):
        cache.update(torch.randn(1, 2, length, 8, generator=g), torch.randn(1, 2, length, 8, generator=g), layer)
    return cache


@pytest.mark.parametrize("offsets", [[0, 2, 5], [0, 1, 2], [0, 3], [0], [0, 4, 9, 11, 12, 30]])
def test_it_keeps_what_the_tensor_ops_keep(offsets):
    """Paths that move rows, an already contiguous one, the root alone; start past the first
    capacity (the buffers grew)."""
    by_ops, by_kernel = filled(None), filled(native_kernels.keep_rows)
    for cache in (by_ops, by_kernel):
        cache.keep(260, torch.tensor(offsets))
    for ops, kernel in zip(by_ops.layers, by_kernel.layers, strict=True):
        assert ops.length == kernel.length == 260 + len(offsets)
        assert torch.equal(ops.keys, kernel.keys) and torch.equal(ops.values, kernel.values)


def test_rows_it_cannot_move_in_order_are_refused():
    buffers = [torch.zeros(1, 2, 16, 8)]
    with pytest.raises(RuntimeError, match="ascend"):
        native_kernels.keep_rows(buffers, 4, torch.tensor([6, 5]))
    with pytest.raises(RuntimeError, match="ascend"):
        native_kernels.keep_rows(buffers, 4, torch.tensor([3]))
    with pytest.raises(RuntimeError, match="capacity"):
        native_kernels.keep_rows(buffers, 4, torch.tensor([4, 16]))
