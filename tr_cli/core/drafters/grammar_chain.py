"""Structure as free drafts: where a grammar leaves no choice (a key, its quotes, `": "`, a
closing brace), the tokens it forces are drafted as a chain under the root.

Proposing them costs no model work, and they are nearly always right: the grammar allows only
those bytes, so the model can differ only by splitting them into other tokens. Where the grammar
allows one token alone, it is certain (probability 1: constrained decoding writes it whatever the
model prefers); the rest of the chain is priced at its measured rate of being right given its
parent was (a smoothed count, prior 0.95), so a planner keeps them ahead of guesses. Drafted while
a constraint is set (decode.set_constraint).
"""

from __future__ import annotations

import torch

from ..constraint import TokenConstraint
from ..tree import TreeSpec
from .base import Draft, Drafter, Placement, Verification

MAX_CHAIN = 16  # forced tokens drafted per step
PRIOR = 0.95
PRIOR_WEIGHT = 10.0


class GrammarChainDrafter(Drafter):
    name = "grammar"

    def __init__(self, constraint: TokenConstraint, device: torch.device | str, depth: int = MAX_CHAIN) -> None:
        self.constraint = constraint
        self.device = torch.device(device)
        self.depth = depth
        self.hits = 0.0
        self.trials = 0.0
        self._specs = {n: TreeSpec.chain(f"grammar{n}", n) for n in range(1, depth + 1)}
        self._drafted = 0
        self._certain = 0

    @property
    def rate(self) -> float:
        """The chance that a forced node is right when its parent is."""
        return (self.hits + PRIOR * PRIOR_WEIGHT) / (self.trials + PRIOR_WEIGHT)

    def propose(self, root: int) -> Draft | None:
        forced = self.constraint.forced()[: self.depth]
        self._drafted = len(forced)
        if not forced:
            return None
        certain = self._certain = self.constraint.certain(forced)
        rate = self.rate
        return Draft(
            spec=self._specs[len(forced)],
            tokens=torch.tensor([root, *forced], dtype=torch.long, device=self.device),
            probabilities=tuple(rate ** max(depth - certain, 0) for depth in range(1, len(forced) + 1)),
        )

    def learn(self, verification: Verification, placement: Placement | None) -> None:
        if placement is None or verification.correct is None or not self._drafted:
            return
        right = verification.right_paths
        parent_right = True  # the root
        for depth, merged in enumerate(placement.nodes, start=1):
            if merged < 0 or not parent_right:
                break
            parent_right = right[merged]
            if depth > self._certain:  # certain nodes say nothing about the rate
                self.trials += 1.0
                self.hits += parent_right

    @property
    def max_nodes(self) -> int:
        return self.depth

    @property
    def max_depth(self) -> int:
        return self.depth

    def describe(self) -> str:
        return f"grammar chain {self.depth}"
