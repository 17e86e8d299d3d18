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
from ..design.acceptance_stats import NEUTRAL_CONTEXT, AcceptanceStats, context_of
from ..design.cost_model import CostModel
from ..design.tree_design import AutoTree
from ..errors import InvalidTree
from ..matrix import filled_rows, update_rows
from ..tree import PRESETS, TreeSpec
from ..tree_buffers import TreeBuffers
from ..wording import counted
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
    name = "matrix"

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
        # Rows that hold candidates: a node under an empty row drafts a placeholder, worth nothing.
        self._filled = filled_rows(matrix)
        self.context = NEUTRAL_CONTEXT  # of the next step: how many drafts the last one accepted

    def design_for(self, cost: CostModel) -> None:
        """Offer priced candidates for trees designed for this cost model from the acceptance
        statistics, redesigned as they come in (a planner picks the nodes per step)."""
        self.auto = AutoTree(self.acceptance, cost, self.k)
        self.spec = self.auto.spec

    def propose(self, root: int) -> Draft | None:
        offer = self.auto.candidates[self.context] if self.auto is not None else None
        spec = offer.spec if offer is not None else self.spec
        if len(spec.parents) == 1:  # no nodes
            return None
        buffers = self._buffers.get(spec, lambda: TreeBuffers.build(spec, self.matrix.device))
        tokens = draft_tree(self.matrix, root, buffers)
        if offer is None:
            return Draft(spec, tokens, buffers)
        return Draft(spec, tokens, buffers, self._priced(offer.probabilities, spec, tokens, buffers))

    def _priced(
        self, probabilities: tuple[float, ...], spec: TreeSpec, tokens: torch.Tensor, buffers: TreeBuffers
    ) -> tuple[float, ...]:
        """The statistics' path probabilities, zero below any row that was never filled (a cold
        matrix drafts placeholders until the conversation fills it)."""
        under_filled = self._filled[tokens[buffers.parents]].tolist()
        ok = [True]
        for i in range(1, spec.size + 1):
            ok.append(ok[spec.parents[i]] and under_filled[i])
        if all(ok):
            return probabilities
        return tuple(p if ok[i] else 0.0 for i, p in enumerate(probabilities, start=1))

    def learn(self, verification: Verification, placement: Placement | None) -> None:
        update_rows(self.matrix, verification.tokens, verification.candidates)
        self._filled[verification.tokens] = True
        if verification.tree is None:  # the prefill: no tree was drafted
            self.context = NEUTRAL_CONTEXT
            return
        if placement is not None and verification.correct is not None:
            # The merged tree's matrix nodes are this drafter's verified ones, with their slots.
            self.acceptance.record_paths(verification.tree, verification.right_paths, self.context)
        if verification.correct is not None:
            self.context = context_of(sum(verification.right_paths) - 1)
        if self.auto is not None:
            self.spec = self.auto.after_step()

    def reset(self) -> None:
        self.context = NEUTRAL_CONTEXT

    @property
    def max_nodes(self) -> int:
        return self.auto.max_nodes if self.auto else self.spec.size

    @property
    def max_depth(self) -> int:
        return self.auto.max_depth if self.auto else self.spec.depth

    def describe(self) -> str:
        how = ", designed for this device" if self.auto else ""
        return f"tree {self.spec.name} ({counted(self.spec.size, 'node')}{how})"
