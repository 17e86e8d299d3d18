"""How often a continuation source's drafts are right, so its nodes can be priced like the tree's.

A node proposed by a lookup source is described by three things known before verification: its
depth, the share of the continuations through its parent that go through it, and how many context
tokens the match behind it had. Each (depth, share, match) cell counts trials (the node's parent
was on a right path) and hits (the node was right too); hits/trials, smoothed toward a prior,
estimates the chance the node extends an accepted path given its parent did. Cells with few
trials lean on the prior scaled by how the whole source does against it, so a source whose drafts
stop being right (a stale store) sees every estimate fall within a few dozen trials, not cell by
cell, and the planner stops paying for its nodes. Counts are halved now and then so that recent
text weighs more.
"""

from __future__ import annotations

DEPTH_EDGES = (1, 2, 3, 5, 9)  # buckets: 1, 2, 3-4, 5-8, 9+
SHARE_EDGES = (0.0, 0.34, 0.67, 0.999)  # buckets: < 1/3, < 2/3, < 1, all continuations agree
MATCH_EDGES = (1, 2, 3, 5, 8)  # buckets: 1, 2, 3-4, 5-7, 8+
PRIOR_WEIGHT = 8.0
SOURCE_WEIGHT = 4.0  # pseudo-trials at the prior for the source-wide factor
DECAY_AT = 4096.0  # trials in all cells; then every count is halved


def _bucket(value: float, edges: tuple) -> int:
    b = 0
    for i, edge in enumerate(edges):
        if value >= edge:
            b = i
    return b


class SourceStats:
    def __init__(self, prior: float) -> None:
        """`prior`: the chance, before any evidence, that a node all continuations agree on is right."""
        if not 0.0 < prior < 1.0:
            raise ValueError(f"prior must lie strictly between 0 and 1, got {prior}")
        self.prior = prior
        shape = len(DEPTH_EDGES) * len(SHARE_EDGES) * len(MATCH_EDGES)
        self.hits = [0.0] * shape
        self.trials = [0.0] * shape
        self._total = 0.0
        self._hits_total = 0.0
        self._expected_total = 0.0  # what the prior predicted for the trials so far

    @staticmethod
    def cell(depth: int, share: float, match: int) -> int:
        d = _bucket(depth, DEPTH_EDGES)
        s = _bucket(share, SHARE_EDGES)
        m = _bucket(match, MATCH_EDGES)
        return (d * len(SHARE_EDGES) + s) * len(MATCH_EDGES) + m

    def _prior_of(self, cell: int) -> float:
        share_bucket = (cell // len(MATCH_EDGES)) % len(SHARE_EDGES)
        return self.prior * (0.4, 0.6, 0.8, 1.0)[share_bucket]

    @property
    def source_factor(self) -> float:
        """How the source's hits compare with what its prior predicted for the same trials."""
        return (self._hits_total + SOURCE_WEIGHT) / (self._expected_total + SOURCE_WEIGHT)

    def probability(self, cell: int) -> float:
        """p(right | parent right) for a node in `cell`."""
        prior = min(self._prior_of(cell) * self.source_factor, 0.99)
        return (self.hits[cell] + PRIOR_WEIGHT * prior) / (self.trials[cell] + PRIOR_WEIGHT)

    def record(self, cells: list[int], tried: list[bool], hit: list[bool]) -> None:
        for cell, t, h in zip(cells, tried, hit, strict=True):
            if t:
                self.trials[cell] += 1.0
                self._total += 1.0
                self._expected_total += self._prior_of(cell)
                if h:
                    self.hits[cell] += 1.0
                    self._hits_total += 1.0
        if self._total > DECAY_AT:
            self.hits = [h / 2 for h in self.hits]
            self.trials = [t / 2 for t in self.trials]
            self._total /= 2
            self._hits_total /= 2
            self._expected_total /= 2

    @property
    def observed(self) -> float:
        return sum(self.trials)

    def hit_rate(self) -> float | None:
        """Hits per trial over all cells (None before any trial): for reports."""
        trials = sum(self.trials)
        return sum(self.hits) / trials if trials else None

    def copy(self) -> SourceStats:
        twin = SourceStats(self.prior)
        twin.hits, twin.trials, twin._total = list(self.hits), list(self.trials), self._total
        twin._hits_total, twin._expected_total = self._hits_total, self._expected_total
        return twin
