"""Choose the draft tree that maximizes expected tokens per second on this device.

Given p(d, s) (the chance that the node at depth d taking slot s is right when its path so far is
right) the expected tokens a step emits are 1 + the sum, over the tree's nodes, of the product of
p along each node's path. For a fixed node count N the best tree takes the N paths of highest
probability; a path's probability never exceeds its parent's, so these N always form a tree, and
a best-first search over (depth, slot) paths yields them in order. The tree kept is the N that
maximizes (1 + E_N) / t(N + 1) under the measured cost model t.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..tree import TreeSpec
from .acceptance_stats import AcceptanceStats
from .cost_model import CostModel

MAX_NODES = 128


@dataclass(frozen=True)
class TreeDesign:
    spec: TreeSpec
    expected_tokens: float  # per step, counting the bonus token
    step_seconds: float  # t(N + 1 + extra)

    @property
    def tokens_per_second(self) -> float:
        return self.expected_tokens / self.step_seconds


def best_paths(p: list[list[float]], k: int, limit: int) -> list[tuple[float, tuple[int, ...]]]:
    """Up to `limit` slot paths in decreasing order of path probability (parents first on ties)."""
    depth_limit = len(p)
    heap: list[tuple[float, int, tuple[int, ...]]] = []
    counter = 0  # tie-breaker: earlier pushes (parents, lower slots) pop first
    for s in range(min(k, len(p[0]))):
        heapq.heappush(heap, (-p[0][s], counter, (s,)))
        counter += 1
    out = []
    while heap and len(out) < limit:
        neg, _, path = heapq.heappop(heap)
        if -neg <= 0:
            break
        out.append((-neg, path))
        d = len(path)
        if d < depth_limit:
            for s in range(min(k, len(p[d]))):
                heapq.heappush(heap, (neg * p[d][s], counter, path + (s,)))
                counter += 1
    return out


def design_tree(
    p: list[list[float]],
    cost: CostModel,
    k: int,
    max_nodes: int = MAX_NODES,
    extra_nodes: int = 0,
    name: str = "auto",
) -> TreeDesign:
    """The tree of at most `max_nodes` draft nodes with the highest expected tokens per second.

    `extra_nodes` are verified beside the tree every step (a lookup chain) and only add cost.
    """
    if max_nodes < 1:
        raise ValueError("design_tree: max_nodes must be at least 1")
    ranked = best_paths(p, k, max_nodes)
    if not ranked:  # nothing has any chance: the cheapest useful tree
        ranked = [(0.0, (0,))]
    best_n, best_rate, expected = 1, -1.0, 1.0
    best_expected = 1.0
    for n, (prob, _) in enumerate(ranked, start=1):
        expected += prob
        rate = expected / cost.time(n + 1 + extra_nodes)
        if rate > best_rate:
            best_n, best_rate, best_expected = n, rate, expected
    spec = TreeSpec.from_paths(f"{name}{best_n}", [list(path) for _, path in ranked[:best_n]])
    return TreeDesign(spec, best_expected, cost.time(best_n + 1 + extra_nodes))


class AutoTree:
    """The designed tree of one decoder, redesigned every `every` steps from live statistics.

    A redesign that lands on the same shape returns an equal spec, which hits the drafter's cached
    buffers.
    """

    def __init__(
        self,
        acceptance: AcceptanceStats,
        cost: CostModel,
        k: int,
        max_nodes: int = MAX_NODES,
        every: int = 32,
        extra_nodes: int = 0,
    ) -> None:
        self.acceptance = acceptance
        self.cost = cost
        self.k = k
        self.max_nodes = max_nodes
        self.every = every
        self.extra_nodes = extra_nodes
        self._steps = 0
        self.design = self._design()

    def _design(self) -> TreeDesign:
        return design_tree(self.acceptance.probabilities(), self.cost, self.k, self.max_nodes, self.extra_nodes)

    @property
    def spec(self) -> TreeSpec:
        return self.design.spec

    @property
    def max_depth(self) -> int:
        """The deepest a redesign may go (the statistics table's depth)."""
        return self.acceptance.max_depth

    def after_step(self) -> TreeSpec:
        self._steps += 1
        if self._steps % self.every == 0:
            self.design = self._design()
        return self.design.spec
