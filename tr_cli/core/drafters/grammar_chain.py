"""Structure as free drafts: where a grammar leaves no choice (a key, its quotes, `": "`, a
closing brace), the tokens it forces are drafted as a chain under the root; where it leaves a few
(`true` or `false`, an enum's values, closing the open value), each choice is a branch with the
chain the grammar forces after it.

Proposing them costs no model work, and forced tokens are nearly always right: the grammar allows
only those bytes, so the model can differ only by splitting them into other tokens. Where the
grammar allows one token alone, it is certain (probability 1: constrained decoding writes it
whatever the model prefers); the rest of a chain is priced at its measured rate of being right
given its parent was (a smoothed count, prior 0.95), and a branch's first token at its own
measured rate of being the model's choice (prior: an even share among the choices, lower for
closing a value, which the model does once per value). A planner weighs them against guesses.
Drafted while a constraint is set (decode.set_constraint); the record outlives one reply.
"""

from __future__ import annotations

from collections import Counter

import torch

from ..constraint import TokenConstraint
from ..tree import EXTERNAL, TreeSpec
from .base import Draft, Drafter, Placement, Verification

MAX_CHAIN = 16  # forced tokens drafted per step
MAX_TURNS = 4  # choices drafted as branches where nothing is forced
MAX_CLOSINGS = 2  # of the ways to close the open value, those drafted
TURN_CHAIN = 8  # forced tokens drafted after each choice
PRIOR = 0.95
PRIOR_WEIGHT = 10.0
TURN_WEIGHT = 4.0
EXIT_PRIOR = 0.2  # closing the open value now: once per value of a few tokens


class GrammarRecord:
    """What the grammar drafts turned out to be, kept across replies: how often a forced node was
    right when its parent was, and how often each choice drafted as a branch was taken."""

    def __init__(self) -> None:
        self.hits = 0.0
        self.trials = 0.0
        self.taken: Counter[int] = Counter()
        self.offered: Counter[int] = Counter()

    @property
    def rate(self) -> float:
        """The chance that a forced node is right when its parent is."""
        return (self.hits + PRIOR * PRIOR_WEIGHT) / (self.trials + PRIOR_WEIGHT)

    def turn_rate(self, token: int, prior: float) -> float:
        """The chance that a choice drafted under the root is the model's."""
        return (self.taken[token] + prior * TURN_WEIGHT) / (self.offered[token] + TURN_WEIGHT)


# What a drafted node is, for what it teaches: a forced token that is the grammar's only choice
# (teaches nothing), another forced one (the chain rate), or a choice (its own rate).
CERTAIN, FORCED, CHOICE = range(3)


class GrammarChainDrafter(Drafter):
    name = "grammar"

    def __init__(
        self,
        constraint: TokenConstraint,
        device: torch.device | str,
        depth: int = MAX_CHAIN,
        record: GrammarRecord | None = None,
    ) -> None:
        self.constraint = constraint
        self.device = torch.device(device)
        self.depth = depth
        self.record = record if record is not None else GrammarRecord()
        # The last draft: per node, its parent, its token and its kind.
        self._parents: list[int] = [-1]
        self._tokens: list[int] = [0]
        self._kinds: list[int] = [CERTAIN]

    @property
    def rate(self) -> float:
        return self.record.rate

    def propose(self, root: int) -> Draft | None:
        self._parents, self._tokens, self._kinds = [-1], [root], [CERTAIN]
        probabilities: list[float] = []
        forced = self.constraint.forced()[: self.depth]
        if forced:
            self._add_chain(0, forced, 1.0, probabilities)
        else:
            turns = self.constraint.turns(MAX_TURNS)
            tokens = turns.tokens
            if turns.closing:  # one way to close is the model's: the likeliest few, by record
                prior = EXIT_PRIOR
                tokens = sorted(tokens, key=lambda t: -self.record.turn_rate(t, prior))[:MAX_CLOSINGS]
            else:
                prior = 1.0 / max(len(tokens), 1)
            for token in tokens:
                self._add_choice(token, prior, probabilities)
        if len(self._parents) == 1:
            return None
        size = len(self._parents) - 1
        return Draft(
            spec=TreeSpec(f"grammar{size}", tuple(self._parents), (0, *(EXTERNAL,) * size)),
            tokens=torch.tensor(self._tokens, dtype=torch.long, device=self.device),
            probabilities=tuple(probabilities),
        )

    def _add(self, parent: int, token: int, kind: int) -> int:
        self._parents.append(parent)
        self._tokens.append(token)
        self._kinds.append(kind)
        return len(self._parents) - 1

    def _add_chain(self, parent: int, forced: list[int], chance: float, probabilities: list[float]) -> None:
        """The forced run under `parent` (right with `chance`): certain nodes keep its chance."""
        if not forced:
            return
        certain = self.constraint.certain(forced)
        rate = self.rate
        for depth, token in enumerate(forced, start=1):
            parent = self._add(parent, token, CERTAIN if depth <= certain else FORCED)
            probabilities.append(chance * rate ** max(depth - certain, 0))

    def _add_choice(self, token: int, prior: float, probabilities: list[float]) -> None:
        """A choice under the root and the run it forces."""
        chance = min(self.record.turn_rate(token, prior), 1.0)
        node = self._add(0, token, CHOICE)
        probabilities.append(chance)
        self.constraint.advance(token)
        try:
            self._add_chain(node, self.constraint.forced()[:TURN_CHAIN], chance, probabilities)
        finally:
            self.constraint.rollback(1)

    def learn(self, verification: Verification, placement: Placement | None) -> None:
        if placement is None or verification.correct is None or len(self._parents) == 1:
            return
        right = verification.right_paths
        record = self.record
        for node in range(1, len(self._parents)):
            merged = placement.nodes[node - 1]
            if merged < 0 or not right[placement.merged(self._parents[node])]:
                continue  # not verified, or its parent was wrong: says nothing about this node
            hit = right[merged]
            kind = self._kinds[node]
            if kind == CHOICE:
                record.offered[self._tokens[node]] += 1
                record.taken[self._tokens[node]] += hit
            elif kind == FORCED:
                record.trials += 1.0
                record.hits += hit

    @property
    def max_nodes(self) -> int:
        return max(self.depth, MAX_TURNS * (1 + TURN_CHAIN))

    @property
    def max_depth(self) -> int:
        return max(self.depth, 1 + TURN_CHAIN)

    def describe(self) -> str:
        return f"grammar chain {self.depth} + {MAX_TURNS} choices"
