"""How often a draft node is right, by depth and candidate slot, learned while decoding.

A node at depth d taking slot s of its parent's row is "tried" when every ancestor was right (the
root counts as right) and "hit" when it also equals its parent's greedy choice. hits/trials
estimates p(d, s), the chance the node extends an accepted path; the expected accepted length of a
tree is then the sum over its nodes of the product of p along the node's path. Counting happens on
the device with one index_add per step (no host sync).
"""

from __future__ import annotations

import torch

from ..bounded_cache import BoundedCache
from ..tree_buffers import TreeBuffers

MAX_DEPTH = 16
PRIOR_WEIGHT = 20.0  # pseudo-trials of the prior per (depth, slot)
DECAY_AT = 50_000.0  # when depth-1 slot-0 trials pass this, halve all counts: recent text counts more
COUNT_DTYPE = torch.float32  # exact for counts far past DECAY_AT, and MPS has no float64


def default_prior(k: int, max_depth: int = MAX_DEPTH) -> list[list[float]]:
    """A prior for p(d, s) before any decoding: likelier slots first, deeper nodes a little surer
    (a path that has been right so far tends to go on). Measured counts replace it quickly."""
    by_slot = [0.42, 0.14, 0.07, 0.045, 0.03, 0.022, 0.017, 0.013]
    rows = []
    for d in range(max_depth):
        lift = min(1.0 + 0.06 * d, 1.4)
        rows.append([min(0.95, (by_slot[s] if s < len(by_slot) else by_slot[-1] * 0.8) * lift) for s in range(k)])
    return rows


class AcceptanceStats:
    def __init__(self, k: int, device: torch.device | str = "cpu", max_depth: int = MAX_DEPTH) -> None:
        self.k = k
        self.max_depth = max_depth
        self.hits = torch.zeros(max_depth * k, dtype=COUNT_DTYPE, device=device)
        self.trials = torch.zeros(max_depth * k, dtype=COUNT_DTYPE, device=device)
        self.prior = torch.tensor(default_prior(k, max_depth), dtype=COUNT_DTYPE, device=device).flatten()
        self._cells: BoundedCache[tuple[torch.Tensor, torch.Tensor]] = BoundedCache()
        self._records = 0

    def _cells_of(self, buffers: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """Matrix nodes that fit the table, and their flat (depth, slot) cell; cached per tree."""

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            nodes = buffers.matrix_nodes
            depth = buffers.depths[nodes] - 1
            keep = (depth < self.max_depth) & (buffers.slots[nodes] < self.k)
            nodes = nodes[keep]
            return nodes, (depth[keep] * self.k + buffers.slots[nodes]).to(self.hits.device)

        return self._cells.get(buffers.spec, build)

    def record(self, buffers: TreeBuffers, correct: torch.Tensor) -> None:
        """Count one verification: correct[i] = node i equals its parent's greedy choice."""
        nodes, cells = self._cells_of(buffers)
        if nodes.numel() == 0:
            return
        wrong = ~correct
        wrong[0] = False
        # A node's path is right when no node in it (itself and its ancestors) is wrong.
        path_right = ~(buffers.ancestor_mask & wrong[None, :]).any(dim=1)
        tried = path_right[buffers.parents[nodes]]
        hit = tried & correct[nodes]
        self.trials.index_add_(0, cells, tried.to(self.trials.dtype))
        self.hits.index_add_(0, cells, hit.to(self.hits.dtype))
        self._records += 1
        if self._records % 256 == 0 and bool(self.trials[0] > DECAY_AT):  # a rare host sync
            self.hits /= 2
            self.trials /= 2

    def probabilities(self) -> list[list[float]]:
        """p(d, s) per depth (0 = depth 1) and slot: measured counts smoothed toward the prior."""
        p = (self.hits + PRIOR_WEIGHT * self.prior) / (self.trials + PRIOR_WEIGHT)
        return p.view(self.max_depth, self.k).tolist()

    @property
    def observed_steps(self) -> int:
        """Verifications counted (depth-1 slot-0 is tried every step of a tree that has it)."""
        return int(self.trials[0])

    def copy(self) -> AcceptanceStats:
        twin = AcceptanceStats(self.k, self.hits.device, self.max_depth)
        twin.hits.copy_(self.hits)
        twin.trials.copy_(self.trials)
        return twin

    def to_dict(self) -> dict:
        return {
            "k": self.k,
            "max_depth": self.max_depth,
            "hits": self.hits.view(self.max_depth, self.k).tolist(),
            "trials": self.trials.view(self.max_depth, self.k).tolist(),
        }

    def load_dict(self, data: dict) -> None:
        """Adopt saved counts of a table of this k (extra depths are dropped); raises ValueError
        for anything else, so a caller can fall back to the prior."""
        hits, trials = data.get("hits"), data.get("trials")
        if data.get("k") != self.k or not isinstance(hits, list) or not isinstance(trials, list):
            raise ValueError(f"acceptance statistics for k={data.get('k')}, expected k={self.k}")
        h = torch.tensor(hits, dtype=torch.float64).flatten()
        t = torch.tensor(trials, dtype=torch.float64).flatten()
        n = min(h.numel(), t.numel(), self.hits.numel())
        if (h[:n] < 0).any() or (h[:n] > t[:n]).any():
            raise ValueError("acceptance statistics: hits must lie between 0 and trials")
        self.hits[:n] = h[:n].to(self.hits.device)
        self.trials[:n] = t[:n].to(self.trials.device)
