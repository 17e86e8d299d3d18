"""How a step's drafts become the one tree a forward pass verifies: the protocol both ways share,
and the plain way.

`DraftMerger` lays the proposals side by side under one root: the first draft keeps its node
order and slots (the matrix tree, when it drafts, stays level by level at the front); every later
draft's nodes follow, re-parented onto the shared root, their slots marked EXTERNAL. The merged
tree's buffers are built once per combination of shapes. With a cost model the decoder uses
planner.DraftPlanner instead, which keeps only the nodes that pay.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..bounded_cache import BoundedCache
from ..tree import PRESETS, TreeSpec
from ..tree_buffers import TreeBuffers
from .base import Draft, Placement


class TreeMerge(Protocol):
    def plan(self, root: int, drafts: list[Draft]) -> tuple[TreeBuffers, torch.Tensor, tuple[Placement, ...]]:
        """The merged tree's buffers, its tokens (root first) and where each draft's nodes went."""
        ...

    def observe(self, seconds: float, accepted: int, verified: int) -> None:
        """How the last plan went: the step's wall time, the drafts it accepted and how many draft
        nodes were verified (fewer than planned when a grammar cut some)."""
        ...


class DraftMerger:
    """Every draft verified whole."""

    def __init__(self, device: torch.device | str, cache_size: int = 32) -> None:
        self.device = torch.device(device)
        self._merged: BoundedCache[tuple[TreeBuffers, tuple[Placement, ...]]] = BoundedCache(cache_size)

    def _build(self, drafts: list[Draft]) -> tuple[TreeBuffers, tuple[Placement, ...]]:
        specs = [draft.spec for draft in drafts]
        placements, start = [], 1
        for part in specs:
            placements.append(Placement.contiguous(start, part.size))
            start += part.size
        if len(drafts) == 1 and drafts[0].buffers is not None:
            return drafts[0].buffers, tuple(placements)  # alone under the root: its own tree
        spec = TreeSpec.merge(specs) if specs else PRESETS["none"]
        return TreeBuffers.build(spec, self.device), tuple(placements)

    def plan(self, root: int, drafts: list[Draft]) -> tuple[TreeBuffers, torch.Tensor, tuple[Placement, ...]]:
        """The merged tree's buffers, its tokens (root first) and where each draft's nodes went."""
        specs = tuple([draft.spec for draft in drafts])
        buffers, placements = self._merged.get(specs, lambda: self._build(drafts))
        if not drafts:
            tokens = torch.tensor([root], dtype=torch.long, device=self.device)
        elif len(drafts) == 1:
            tokens = drafts[0].tokens  # the common case: nothing to copy
        else:
            tokens = torch.cat([drafts[0].tokens, *(draft.tokens[1:] for draft in drafts[1:])])
        return buffers, tokens, placements

    def observe(self, seconds: float, accepted: int, verified: int) -> None:
        """Nothing to learn: every draft is verified whole."""
