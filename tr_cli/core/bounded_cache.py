"""A small least-recently-used map for things built once per tree shape (buffers, index tensors).

A designed tree changes every few dozen steps, so a plain dict of per-shape buffers would grow for
as long as a conversation lasts; this keeps the most recent few.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

DEFAULT_SIZE = 32


class BoundedCache(Generic[V]):
    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError(f"cache size must be at least 1, got {size}")
        self.size = size
        self._items: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], V]) -> V:
        """The value for `key`, built (and the oldest entry dropped when full) on a miss."""
        value = self._items.get(key)
        if value is None:
            value = self._items[key] = build()
            if len(self._items) > self.size:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return value

    def __len__(self) -> int:
        return len(self._items)
