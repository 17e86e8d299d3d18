"""Plan each step's tree across draft sources: price every node, keep the ones that pay.

Every priced draft says, per node, the chance that the node is right along with its whole path.
Verifying N nodes costs t(N + 1) (the measured cost model) and emits 1 + the sum of those chances
in expectation, so the planner ranks all sources' nodes by chance (a node never outranks its
parent) and keeps the prefix with the most expected tokens per second. A source whose nodes are
rarely right (a stale store) gets none; a long, sure match may crowd out most of the matrix tree.

Sources often propose the same token after the same path (the lookup and the matrix's first
candidate, say): such nodes are verified once. Matrix nodes come first and in level order, as
tree specs require; other sources' nodes follow, hung under whichever node holds their parent.

The planner also checks itself. Picking the nodes whose estimates are highest overrates them (the
winner's curse: measured here, 2.5 tokens expected per drafted step against 2.0 accepted), and a
real step costs more than the calibration's (longer contexts, masks, bookkeeping: ~7 % for trees,
~2 % for one token). So it keeps decayed sums of what its plans expected and got, and of what
steps were predicted to cost and did, and plans with those ratios. The price of drafting nothing
is only learned from steps that drafted nothing, and a planner that always drafts would never see
one: a calibration that overrated t(1) (taken under load, measured here at 7.2 ms for a 4.7 ms
step) then made every tree look cheap and `tr` slower than one token a step. So after
EXPLORE_EVERY drafted steps in a row one step drafts nothing (and after as many plain steps, one
drafts its best plan), which costs about 1 % of the drafts' gain.
"""

from __future__ import annotations

import torch

from ..bounded_cache import BoundedCache
from ..design.cost_model import CostModel
from ..tree import EXTERNAL, TreeSpec
from ..tree_buffers import TreeBuffers
from .base import Draft, Placement

DECAY = 0.98  # per observed step: the ratios follow the last ~50 steps
PRIOR_STEPS = 8.0  # pseudo-steps at ratio 1 before any observation
EXPLORE_EVERY = 48  # drafted steps in a row after which one step measures the plain cost
EXPLORE_FIRST = 8  # ... at first: 8, 16, 24... steps while few plain steps were seen


class _Ratio:
    """A decayed ratio of observed to predicted sums, 1 until observations say otherwise."""

    def __init__(self, prior: float = PRIOR_STEPS) -> None:
        self.observed = self.predicted = prior
        self.count = 0  # observations

    def add(self, observed: float, predicted: float) -> None:
        self.observed = self.observed * DECAY + observed
        self.predicted = self.predicted * DECAY + predicted
        self.count += 1

    @property
    def value(self) -> float:
        return self.observed / self.predicted


class DraftPlanner:
    """Every step's tree planned for a cost model (merge.TreeMerge)."""

    def __init__(self, cost: CostModel, device: torch.device | str, cache_size: int = 64) -> None:
        self.cost = cost
        self.device = torch.device(device)
        self._buffers: BoundedCache[TreeBuffers] = BoundedCache(cache_size)
        self.last_expected = 1.0  # expected tokens of the last plan (for reports and tests)
        self.gain = _Ratio()  # accepted drafts / expected, over drafted steps
        self.step_time = _Ratio()  # seconds / t(N + 1), over drafted steps
        # The same over steps that drafted nothing: rare (exploration), so a light prior.
        self.plain_time = _Ratio(prior=1.0)
        self._last_estimate = 0.0  # the sources' own sum of path probabilities in the last plan
        self._drafted_in_a_row = self._plain_in_a_row = 0

    def time(self, size: int) -> float:
        """What a step over `size` tokens is expected to cost, as observed so far."""
        return self.cost.time(size) * (self.step_time.value if size > 1 else self.plain_time.value)

    def observe(self, seconds: float, accepted: int, verified: int) -> None:
        """How the last plan went: the step's wall time, the drafts it accepted and how many draft
        nodes were verified (a grammar may have cut some of the plan's)."""
        predicted = self.cost.time(verified + 1)
        if verified:
            self.step_time.add(seconds, predicted)
            self.gain.add(accepted, self._last_estimate)
            self._drafted_in_a_row, self._plain_in_a_row = self._drafted_in_a_row + 1, 0
        else:
            self.plain_time.add(seconds, predicted)
            self._drafted_in_a_row, self._plain_in_a_row = 0, self._plain_in_a_row + 1

    def plan(self, root: int, drafts: list[Draft]) -> tuple[TreeBuffers, torch.Tensor, tuple[Placement, ...]]:
        """The merged tree's buffers, its tokens (root first) and where each draft's nodes went."""
        tokens = [draft.tokens.tolist() for draft in drafts]
        # Canonical nodes, one per distinct token path: (parent canonical id, token) -> id; id 0 is the root.
        canon: dict[tuple[int, int], int] = {}
        canon_parent, canon_token, canon_depth = [-1], [root], [0]
        mapped: list[list[int]] = [[0] + [-1] * draft.spec.size for draft in drafts]

        def place(i: int, j: int) -> bool:
            """Map draft i's node j onto a canonical node; True when that node is new."""
            parent = mapped[i][drafts[i].spec.parents[j]]
            key = (parent, tokens[i][j])
            node = canon.get(key)
            new = node is None
            if new:
                node = canon[key] = len(canon_parent)
                canon_parent.append(parent)
                canon_token.append(tokens[i][j])
                canon_depth.append(canon_depth[parent] + 1)
            mapped[i][j] = node
            return new

        # Unpriced drafts are verified whole; priced nodes compete by their chance of being right.
        forced = 0
        ranked = []
        for i, draft in enumerate(drafts):
            if draft.probabilities is None:
                forced += sum(place(i, j) for j in range(1, draft.spec.size + 1))
            else:
                depths = draft.spec.depths
                ranked += [(-p, depths[j], i, j) for j, p in enumerate(draft.probabilities, start=1)]
        ranked.sort()
        gain = self.gain.value
        nodes, expected = forced, 1.0
        plain = (expected / self.time(1 + nodes), 0, expected)  # (rate, nodes kept, expected tokens)
        drafting = None  # the best plan that keeps at least one priced node
        for count, (neg_p, _, i, j) in enumerate(ranked, start=1):
            if place(i, j):
                nodes += 1
                expected -= neg_p * gain
            rate = expected / self.time(1 + nodes)
            if drafting is None or rate > drafting[0]:
                drafting = (rate, count, expected)
        best = drafting if drafting is not None and drafting[0] > plain[0] else plain
        if not forced:  # now and then the other choice, so that both prices stay measured
            if self._drafted_in_a_row >= min(EXPLORE_EVERY, EXPLORE_FIRST * (1 + self.plain_time.count)):
                best = plain
            elif self._plain_in_a_row >= EXPLORE_EVERY and drafting is not None:
                best = drafting
        _, best_count, best_expected = best
        for _, _, i, j in ranked[best_count:]:
            mapped[i][j] = -1  # left out
        self.last_expected = best_expected
        self._last_estimate = (best_expected - 1.0) / gain
        return self._build(drafts, mapped, canon_parent, canon_token, canon_depth)

    def _build(self, drafts, mapped, canon_parent, canon_token, canon_depth):
        # Which canonical nodes are verified, and which of them are matrix nodes (with their slot).
        used: set[int] = set()
        slot_of: dict[int, int] = {}
        for draft, nodes in zip(drafts, mapped, strict=True):
            for j in range(1, draft.spec.size + 1):
                node = nodes[j]
                if node > 0:
                    used.add(node)
                    slot = draft.spec.slots[j]
                    if slot != EXTERNAL and node not in slot_of:
                        slot_of[node] = slot
        matrix = sorted(slot_of, key=lambda c: (canon_depth[c], c))
        others = sorted(used - slot_of.keys(), key=lambda c: (canon_depth[c], c))
        order = [0, *matrix, *others]
        merged = {c: m for m, c in enumerate(order)}
        parents = tuple(-1 if c == 0 else merged[canon_parent[c]] for c in order)
        slots = (0, *(slot_of[c] for c in matrix), *(EXTERNAL,) * len(others))
        spec = TreeSpec(f"plan{len(matrix)}+{len(others)}", parents, slots)
        buffers = self._buffers.get(spec, lambda: TreeBuffers.build(spec, self.device))
        tokens = torch.tensor([canon_token[c] for c in order], dtype=torch.long, device=self.device)
        placements = tuple(Placement(tuple(merged[c] if c > 0 else -1 for c in nodes[1:])) for nodes in mapped)
        return buffers, tokens, placements
