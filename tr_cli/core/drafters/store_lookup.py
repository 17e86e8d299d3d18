"""The recycled store as a draft source: what followed the context's tail in earlier
conversations. Each conversation joins the store when it ends (a reset)."""

from __future__ import annotations

import time

import torch

from ..design.source_stats import SourceStats
from ..recycled_store import ORDERS, RecycledStore
from .continuation_drafter import ContinuationDrafter
from .continuation_tree import Continuation
from .plan import STORE_DEPTH

STORE_BRANCHES = 4
STORE_NODES = 32
STORE_PRIOR = 0.25  # other conversations' text: less sure than this conversation's own


class StoreLookupDrafter(ContinuationDrafter):
    name = "store"

    def __init__(
        self,
        store: RecycledStore,
        device: torch.device | str = "cpu",
        depth: int = STORE_DEPTH,
        branches: int = STORE_BRANCHES,
        max_nodes: int = STORE_NODES,
        stats: SourceStats | None = None,
    ) -> None:
        super().__init__(depth, branches, max_nodes, stats or SourceStats(STORE_PRIOR), device)
        self.store = store
        self.conversation: list[int] = []

    def continuations(self, depth: int, limit: int) -> list[Continuation]:
        return self.store.continuations(self.conversation[-max(ORDERS) :], depth, limit)

    def extend(self, tokens: list[int]) -> None:
        self.conversation.extend(tokens)

    def reset(self) -> None:
        """The conversation so far joins the store; the next one starts empty."""
        if self.conversation:
            self.store.add(self.conversation, time.time_ns() // 1000)
        self.conversation = []

    def describe(self) -> str:
        return f"store {self.depth}x{self.branches} ({self.store.total_tokens:,} tokens)"
