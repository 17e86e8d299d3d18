"""A preallocated KV cache that keeps exactly prefix + accepted path, compacted in place.

Each layer owns a buffer with spare capacity: a forward writes its new keys/values into the
buffer (no full-cache concatenation per step), and after verification the accepted tree rows are
moved down in place next to the prefix. Implemented through transformers' public cache API
(`Cache` + a `CacheLayerMixin` subclass), so any decoder that calls `cache.update` works with it.
Sliding-window layers also keep every position: the mask, not the cache, applies the window.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

_MIN_CAPACITY = 256
# A model may carry a faster compaction under this attribute (models/ attaches tr's kernel):
# `keep(buffers, start, rows)` moves each buffer's rows `rows` (ascending absolute positions, each at
# or past its destination) to start, start+1, ... in place, for buffers (1, heads, capacity, dim).
KEEP_ROWS = "tr_keep_rows"
RowKeeper = Callable[[list[torch.Tensor], int, torch.Tensor], None]


class CompactingLayer(CacheLayerMixin):
    is_sliding = False
    is_croppable = True

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._keys = key_states.new_empty(*key_states.shape[:2], _MIN_CAPACITY, key_states.shape[3])
        self._values = value_states.new_empty(*value_states.shape[:2], _MIN_CAPACITY, value_states.shape[3])
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        capacity = self._keys.shape[2]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity)
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            grown = old.new_empty(*old.shape[:2], new_capacity, old.shape[3])
            grown[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, grown)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self._reserve(self.length + n)
        self._keys[:, :, self.length : self.length + n] = key_states
        self._values[:, :, self.length : self.length + n] = value_states
        self.length += n
        return self.keys, self.values

    # The cached rows as views, made when read: a step that writes through open_rows and compacts
    # never reads them, and making 60 views a step cost ~0.5 ms on a slow CPU.
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._refuse_replacement(value)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._refuse_replacement(value)

    @staticmethod
    def _refuse_replacement(value: torch.Tensor | None) -> None:
        """CacheLayerMixin's __init__ sets them to None (nothing to do); moving them elsewhere
        (transformers' offloading) is not something this cache does."""
        if value is not None:
            raise NotImplementedError("a compacting cache keeps its rows in its own buffers")

    def keep(self, start: int, rows: torch.Tensor) -> None:
        """Keep rows [0, start) plus `rows` (absolute positions, ascending, on the cache's device),
        moved to start, start+1, ..."""
        if not self.is_initialized:
            return
        count = rows.shape[0]
        if count:
            # Advanced indexing copies the source rows first, so overlapping moves are safe.
            self._keys[:, :, start : start + count] = self._keys[:, :, rows]
            self._values[:, :, start : start + count] = self._values[:, :, rows]
        self.length = start + count

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:  # transformers' legacy form: the size to keep
            self.length = min(self.length, tokens_to_remove)
        elif tokens_to_remove < 0:
            self.length = max(0, self.length + tokens_to_remove)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0


class CompactingCache(Cache):
    """One CompactingLayer per decoder layer, created as layers first write. `keep_rows`: a faster
    compaction of all layers at once (KEEP_ROWS), where the model has one."""

    def __init__(self, keep_rows: RowKeeper | None = None) -> None:
        super().__init__(layer_class_to_replicate=CompactingLayer)
        self._keep_rows = keep_rows

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def keep(self, start: int, offsets: torch.Tensor) -> None:
        """Drop everything after `start` except the rows at start+offsets, in every layer."""
        if not self.layers or not self.layers[0].is_initialized:
            return
        rows = offsets.to(self.layers[0].device) + start  # once for all layers
        if (
            self._keep_rows is not None
            and rows.device.type == "cpu"
            and all(layer.is_initialized for layer in self.layers)
        ):
            self._keep_rows([b for layer in self.layers for b in (layer._keys, layer._values)], start, rows)
            for layer in self.layers:
                layer.length = start + rows.shape[0]
            return
        for layer in self.layers:
            layer.keep(start, rows)

    def open_rows(
        self, layers: int, count: int, like: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """For a forward that writes `count` new positions into every one of `layers` layers itself (a
        whole step in one call, models/fused_layers.py): each layer's key and value buffers, (1, kv heads,
        capacity, head dim) with room for them, and the position the new rows start at. `like`: a
        (1, kv heads, any, head dim) tensor of the cache's dtype and device. Call `advance(count)` once
        they are written."""
        while len(self.layers) < layers:
            self.layers.append(CompactingLayer())
        for layer in self.layers:
            if not layer.is_initialized:
                layer.lazy_initialization(like, like)
            layer._reserve(layer.length + count)
        return [layer._keys for layer in self.layers], [layer._values for layer in self.layers], self.length

    def advance(self, count: int) -> None:
        """The `count` rows after the cached ones, written through `open_rows`, are now cached."""
        for layer in self.layers:
            layer.length += count

    def truncate(self, length: int) -> None:
        """Keep only the first `length` positions in every layer."""
        for layer in self.layers:
            layer.length = min(layer.length, length)
