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
from .acceptance_stats import CONTEXTS, NEUTRAL_CONTEXT, AcceptanceStats
from .cost_model import CostModel

MAX_NODES = 128
CANDIDATE_MARGIN = 8  # matrix nodes offered to a per-step planner beyond the tree designed alone


@dataclass(frozen=True)
class TreeDesign:
    spec: TreeSpec
    expected_tokens: float  # per step, counting the bonus token
    step_seconds: float  # t(N + 1)

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
    name: str = "auto",
) -> TreeDesign:
    """The tree of at most `max_nodes` draft nodes with the highest expected tokens per second."""
    if max_nodes < 1:
        raise ValueError("design_tree: max_nodes must be at least 1")
    ranked = best_paths(p, k, max_nodes)
    if not ranked:  # nothing has any chance: the cheapest useful tree
        ranked = [(0.0, (0,))]
    best_n, best_rate, expected = 1, -1.0, 1.0
    best_expected = 1.0
    for n, (prob, _) in enumerate(ranked, start=1):
        expected += prob
        rate = expected / cost.time(n + 1)
        if rate > best_rate:
            best_n, best_rate, best_expected = n, rate, expected
    spec = TreeSpec.from_paths(f"{name}{best_n}", [list(path) for _, path in ranked[:best_n]])
    return TreeDesign(spec, best_expected, cost.time(best_n + 1))


@dataclass(frozen=True)
class Candidates:
    """The matrix nodes a planner may choose from, with each one's path probability."""

    spec: TreeSpec
    probabilities: tuple[float, ...]  # per node 1..n of spec


def candidates(p: list[list[float]], k: int, count: int) -> Candidates:
    """The `count` likeliest matrix paths as one tree (level order) and their probabilities."""
    ranked = best_paths(p, k, count) or [(0.0, (0,))]
    spec = TreeSpec.from_paths(f"cand{len(ranked)}", [list(path) for _, path in ranked])
    prob = {path: q for q, path in ranked}
    return Candidates(spec, tuple(prob[tuple(path)] for path in spec.paths()))


class AutoTree:
    """The designed tree of one decoder, redesigned every `every` steps from live statistics.

    A redesign that lands on the same shape returns an equal spec, which hits the drafter's cached
    buffers. `candidates[c]` offers a planner, for a step drafted in context c (see
    acceptance_stats), that context's designed tree and a few more nodes, priced.
    """

    def __init__(
        self,
        acceptance: AcceptanceStats,
        cost: CostModel,
        k: int,
        max_nodes: int = MAX_NODES,
        every: int = 32,
    ) -> None:
        self.acceptance = acceptance
        self.cost = cost
        self.k = k
        self.max_nodes = max_nodes
        self.every = every
        self._steps = 0
        self._redesign()

    def _redesign(self) -> None:
        self.candidates: list[Candidates] = []
        for context in range(CONTEXTS):
            p = self.acceptance.probabilities(context)
            design = design_tree(p, self.cost, self.k, self.max_nodes)
            self.candidates.append(candidates(p, self.k, min(self.max_nodes, design.spec.size + CANDIDATE_MARGIN)))
            if context == NEUTRAL_CONTEXT:
                self.design = design  # the one banners show

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
            self._redesign()
        return self.design.spec
