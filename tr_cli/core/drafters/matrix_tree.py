"""Token Recycling's own drafts: a tree read out of the adjacency matrix, and the matrix's learning.

The tree is walked from the root by BFS: node i gets matrix[token(parent(i)), slot(i)], one
vectorized gather per level. After every forward pass the matrix rows of *all* verified tokens
(whatever drafter proposed them) take the model's top-k after them, and the acceptance statistics
count how often each (depth, slot) of the matrix tree was right. With a cost model the tree is
designed for the device from those statistics and redesigned as they come in.
"""

from __future__ import annotations

import torch

from ..bounded_cache import BoundedCache
from ..design.acceptance_stats import AcceptanceStats
from ..design.cost_model import CostModel
from ..design.tree_design import AutoTree
from ..errors import InvalidTree
from ..matrix import update_rows
from ..tree import PRESETS, TreeSpec
from ..tree_buffers import TreeBuffers
from .base import Draft, Drafter, Placement, Verification


def draft_tree(matrix: torch.Tensor, root_token: int | torch.Tensor, buffers: TreeBuffers) -> torch.Tensor:
    """Tokens of every matrix node of the tree, (n+1,) long, node 0 = root_token.

    Level d only depends on level d-1, so each level is a single gather; the loop runs over depths
    (about 6), never over nodes.
    """
    tokens = torch.empty(buffers.size, dtype=torch.long, device=matrix.device)
    tokens[0] = root_token
    for parents, slots, start, end in buffers.level_gathers:
        tokens[start:end] = matrix[tokens[parents], slots]
    return tokens


class MatrixTreeDrafter(Drafter):
    def __init__(
        self,
        matrix: torch.Tensor,
        tree: TreeSpec | None = None,
        acceptance: AcceptanceStats | None = None,
        seed_from_prompt: bool = True,
    ) -> None:
        """`tree` fixes the shape (default: the paper's); `design_for` switches to designed trees.
        `seed_from_prompt`: the prompt's prefill outputs fill the matrix too."""
        self.matrix = matrix
        self.k = matrix.shape[1]
        self.acceptance = acceptance if acceptance is not None else AcceptanceStats(self.k, matrix.device)
        if self.acceptance.k != self.k:
            raise ValueError(f"acceptance statistics are for k={self.acceptance.k} but the matrix has k={self.k}")
        self.spec = tree if tree is not None else PRESETS["paper"]
        if self.spec.external_size:
            raise InvalidTree(f"tree {self.spec.name} has non-matrix nodes; a matrix tree has only matrix slots")
        if self.spec.max_slot >= self.k:
            raise InvalidTree(f"tree {self.spec.name} uses candidate slot {self.spec.max_slot} but k={self.k}")
        self.auto: AutoTree | None = None
        self.learns_from_prefill = seed_from_prompt
        self._buffers: BoundedCache[TreeBuffers] = BoundedCache()
        self._proposed: TreeBuffers | None = None

    def design_for(self, cost: CostModel, extra_nodes: int = 0) -> None:
        """Draft trees designed for this cost model from the acceptance statistics, redesigned as
        they come in; `extra_nodes` (other drafters' nodes) are verified beside the tree."""
        self.auto = AutoTree(self.acceptance, cost, self.k, extra_nodes=extra_nodes)
        self.spec = self.auto.spec

    def propose(self, root: int) -> Draft | None:
        spec = self.spec
        if len(spec.parents) == 1:  # no nodes
            self._proposed = None
            return None
        buffers = self._proposed = self._buffers.get(spec, lambda: TreeBuffers.build(spec, self.matrix.device))
        return Draft(spec, draft_tree(self.matrix, root, buffers), buffers)

    def learn(self, verification: Verification, placement: Placement | None) -> None:
        update_rows(self.matrix, verification.tokens, verification.candidates)
        if verification.tree is None:  # the prefill: no tree was drafted
            return
        if placement is not None and verification.correct is not None and self._proposed is not None:
            self.acceptance.record(self._proposed, placement.select(verification.correct))
        if self.auto is not None:
            self.spec = self.auto.after_step()

    @property
    def max_nodes(self) -> int:
        return self.auto.max_nodes if self.auto else self.spec.size

    @property
    def max_depth(self) -> int:
        return self.auto.max_depth if self.auto else self.spec.depth

    def describe(self) -> str:
        how = ", designed for this device" if self.auto else ""
        return f"tree {self.spec.name} ({self.spec.size} nodes{how})"
