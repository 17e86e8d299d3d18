"""The common part of the lookup sources: find earlier continuations of the context, fold them
into a small tree, price its nodes from the source's own record, and learn from the outcome."""

from __future__ import annotations

from abc import abstractmethod

import torch

from ..design.source_stats import SourceStats
from ..tree import EXTERNAL, TreeSpec
from .base import Draft, Drafter, Placement, Verification
from .continuation_tree import Continuation, fold


class ContinuationDrafter(Drafter):
    name = "lookup"

    def __init__(self, depth: int, branches: int, max_nodes: int, stats: SourceStats, device: torch.device | str):
        if depth < 1 or branches < 1 or max_nodes < 1:
            raise ValueError(f"a lookup source needs depth, branches and nodes >= 1: {depth}, {branches}, {max_nodes}")
        self.depth = depth
        self.branches = branches
        self.nodes = max_nodes
        self.stats = stats
        self.device = torch.device(device)
        self._proposed: tuple[tuple[int, ...], list[int]] | None = None  # (parents, cells) of the last draft

    @abstractmethod
    def continuations(self, depth: int, limit: int) -> list[Continuation]:
        """Earlier continuations of the current context, best first."""

    def propose(self, root: int) -> Draft | None:
        self._proposed = None
        found = self.continuations(self.depth, self.branches)
        if not found:
            return None
        tree = fold(found, self.nodes)
        if tree.size == 0:
            return None
        cells = [0] + [self.stats.cell(tree.depths[i], tree.share[i], tree.match[i]) for i in range(1, tree.size + 1)]
        path = [1.0]
        for i in range(1, tree.size + 1):
            path.append(path[tree.parents[i]] * self.stats.probability(cells[i]))
        spec = TreeSpec(f"{self.name}{tree.size}", tree.parents, (0, *(EXTERNAL,) * tree.size))
        tokens = torch.tensor([root, *tree.tokens[1:]], dtype=torch.long, device=self.device)
        self._proposed = (tree.parents, cells)
        return Draft(spec, tokens, probabilities=tuple(path[1:]))

    def learn(self, verification: Verification, placement: Placement | None) -> None:
        if placement is None or verification.correct is None or self._proposed is None:
            return
        parents, cells = self._proposed
        right = verification.right_paths
        placed = [i for i in range(1, len(parents)) if placement.nodes[i - 1] >= 0]
        tried = [right[placement.merged(parents[i])] for i in placed]
        hit = [t and right[placement.merged(i)] for t, i in zip(tried, placed, strict=True)]
        self.stats.record([cells[i] for i in placed], tried, hit)

    @property
    def max_nodes(self) -> int:
        return self.nodes

    @property
    def max_depth(self) -> int:
        return self.depth
