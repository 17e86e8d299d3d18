"""How often a draft node is right, by depth and candidate slot, learned while decoding.

A node at depth d taking slot s of its parent's row is "tried" when every ancestor was right (the
root counts as right) and "hit" when it also equals its parent's greedy choice. hits/trials
estimates p(d, s), the chance the node extends an accepted path; the expected accepted length of a
tree is then the sum over its nodes of the product of p along the node's path. Counting takes the
step's right paths from the host (a step's learners share them) and two index_adds.

Acceptance runs in streaks (text that flows, text that does not), so the table is kept per
context: how many drafts the previous step accepted (0, 1, 2 or more). Measured here on SmolLM2
with a small fixed tree: 0.64 tokens accepted per step after a step that accepted none, 1.12
after one that accepted two: where a tree costs ~1.7 one-token steps, that decides whether to
draft at all.
"""

from __future__ import annotations

import torch

from ..bounded_cache import BoundedCache
from ..tree_buffers import TreeBuffers

MAX_DEPTH = 16
CONTEXTS = 3  # the previous step accepted 0, 1, or 2+ drafts
NEUTRAL_CONTEXT = 1  # no previous step yet (a new turn)
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


def context_of(accepted: int) -> int:
    """The context a step is drafted in, from how many drafts the previous step accepted."""
    return min(accepted, CONTEXTS - 1)


class AcceptanceStats:
    def __init__(self, k: int, device: torch.device | str = "cpu", max_depth: int = MAX_DEPTH) -> None:
        self.k = k
        self.max_depth = max_depth
        self._cell_count = max_depth * k  # cells per context
        self.hits = torch.zeros(CONTEXTS * self._cell_count, dtype=COUNT_DTYPE, device=device)
        self.trials = torch.zeros(CONTEXTS * self._cell_count, dtype=COUNT_DTYPE, device=device)
        prior = torch.tensor(default_prior(k, max_depth), dtype=COUNT_DTYPE, device=device).flatten()
        self.prior = prior.repeat(CONTEXTS)
        self._cells: BoundedCache[tuple[torch.Tensor, torch.Tensor]] = BoundedCache()
        self._host_cells: BoundedCache[tuple[list[int], list[int]]] = BoundedCache()
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

    def _host_cells_of(self, buffers: TreeBuffers) -> tuple[list[int], list[int]]:
        """_cells_of as lists, cached per tree."""
        return self._host_cells.get(buffers.spec, lambda: tuple(t.tolist() for t in self._cells_of(buffers)))

    def record(self, buffers: TreeBuffers, correct: torch.Tensor, context: int = NEUTRAL_CONTEXT) -> None:
        """Count one verification drafted in `context`: correct[i] = node i equals its parent's
        greedy choice."""
        self.record_paths(buffers, buffers.right_paths(correct), context)

    def record_paths(self, buffers: TreeBuffers, right: list[bool], context: int = NEUTRAL_CONTEXT) -> None:
        """Count one verification drafted in `context`: right[i] = node i and all its ancestors are
        right (what a step's learners share, on the host). A matrix node is tried when its parent's
        path is right and hit when its own is: two index_adds, built from lists (a tree has a few
        nodes: list work beats a dozen tensor ops)."""
        nodes, cells = self._host_cells_of(buffers)
        parents, offset = buffers.spec.parents, context * self._cell_count
        tried = [cell + offset for node, cell in zip(nodes, cells, strict=True) if right[parents[node]]]
        if not tried:
            return
        hit = [cell + offset for node, cell in zip(nodes, cells, strict=True) if right[node]]
        for counts, cells_counted in ((self.trials, tried), (self.hits, hit)):
            if cells_counted:
                ones = torch.ones(len(cells_counted), dtype=COUNT_DTYPE, device=counts.device)
                counts.index_add_(0, torch.tensor(cells_counted, device=counts.device), ones)
        self._records += 1
        if self._records % 256 == 0 and bool(self._first_cells().sum() > DECAY_AT):  # a rare host sync
            self.hits /= 2
            self.trials /= 2

    def _first_cells(self) -> torch.Tensor:
        """Trials of depth 1, slot 0 per context (tried every step of a tree that has it)."""
        return self.trials.view(CONTEXTS, self.max_depth, self.k)[:, 0, 0]

    def probabilities(self, context: int = NEUTRAL_CONTEXT) -> list[list[float]]:
        """p(d, s) per depth (0 = depth 1) and slot in `context`: measured counts smoothed
        toward the prior."""
        span = slice(context * self._cell_count, (context + 1) * self._cell_count)
        p = (self.hits[span] + PRIOR_WEIGHT * self.prior[span]) / (self.trials[span] + PRIOR_WEIGHT)
        return p.view(self.max_depth, self.k).tolist()

    @property
    def observed_steps(self) -> int:
        """Verifications counted (depth-1 slot-0 is tried every step of a tree that has it)."""
        return int(self._first_cells().sum())

    def copy(self) -> AcceptanceStats:
        twin = AcceptanceStats(self.k, self.hits.device, self.max_depth)
        twin.hits.copy_(self.hits)
        twin.trials.copy_(self.trials)
        return twin

    def plus_counted(self, now: AcceptanceStats, then: AcceptanceStats) -> AcceptanceStats:
        """These counts plus what `now` counted since it was `then` (another process's table
        merging onto this one). Clamped to 0 <= hits <= trials: a decay in between leaves
        negative differences."""
        merged = self.copy()
        for mine, later, earlier in ((merged.hits, now.hits, then.hits), (merged.trials, now.trials, then.trials)):
            mine += (later - earlier.to(later.device)).to(mine.device)
            mine.clamp_(min=0)
        torch.minimum(merged.hits, merged.trials, out=merged.hits)
        return merged

    def to_dict(self) -> dict:
        shape = (CONTEXTS, self.max_depth, self.k)
        return {
            "k": self.k,
            "max_depth": self.max_depth,
            "contexts": CONTEXTS,
            "hits": self.hits.view(shape).tolist(),
            "trials": self.trials.view(shape).tolist(),
        }

    def load_dict(self, data: dict) -> None:
        """Adopt saved counts of a table of this k (extra depths are dropped; a table saved
        without contexts counts for each); raises ValueError for anything else, so a caller can
        fall back to the prior."""
        hits, trials = data.get("hits"), data.get("trials")
        if data.get("k") != self.k or not isinstance(hits, list) or not isinstance(trials, list):
            raise ValueError(f"acceptance statistics for k={data.get('k')}, expected k={self.k}")
        h = torch.tensor(hits, dtype=torch.float64)
        t = torch.tensor(trials, dtype=torch.float64)
        if h.shape != t.shape or h.dim() not in (2, 3) or h.shape[-1] != self.k:
            raise ValueError("acceptance statistics: hits and trials must be tables of k columns")
        if h.dim() == 2:
            h, t = h.expand(CONTEXTS, -1, -1), t.expand(CONTEXTS, -1, -1)
        if h.shape[0] != CONTEXTS:
            raise ValueError(f"acceptance statistics: {h.shape[0]} contexts, expected {CONTEXTS}")
        if not (torch.isfinite(h).all() and torch.isfinite(t).all()):
            raise ValueError("acceptance statistics: counts must be finite numbers")
        if (h < 0).any() or (h > t).any():
            raise ValueError("acceptance statistics: hits must lie between 0 and trials")
        depth = min(h.shape[1], self.max_depth)
        shape = (CONTEXTS, self.max_depth, self.k)
        self.hits.view(shape)[:, :depth] = h[:, :depth].to(self.hits.device, COUNT_DTYPE)
        self.trials.view(shape)[:, :depth] = t[:, :depth].to(self.trials.device, COUNT_DTYPE)
