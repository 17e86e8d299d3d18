"""The drafting interface: what a source of draft tokens does each step.

Before a step the decoder asks every drafter for a Draft: a small tree under the root (the last
emitted token, not yet in the KV cache) and the tokens of its nodes. The drafts are laid side by
side under one root (drafters/merge.py) and verified in one forward pass. Afterwards every
drafter learns from the Verification: the tokens of all nodes, the model's top-k candidates after
each of them, and which nodes were right. Conversation tokens (prompt and emitted) reach every
drafter through `extend`; `reset` starts a new conversation.

A new source implements this class and is handed to the decoder; the loop does not change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property

import torch

from ..tree import TreeSpec
from ..tree_buffers import TreeBuffers


@dataclass(frozen=True)
class Draft:
    """One drafter's proposal for one step."""

    spec: TreeSpec  # its shape: node 0 is the shared root, nodes 1..n its drafts (n >= 1)
    tokens: torch.Tensor  # (n+1,) long on the decoder's device: the root's token, then nodes 1..n
    buffers: TreeBuffers | None = None  # the drafter's own buffers of `spec`, if it has them (reused)
    # Per node 1..n, the estimated chance that it is right together with its whole path: what a
    # planner weighs against the cost of verifying it. None: not priced (always verified whole).
    probabilities: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Verification:
    """What one forward pass said about the verified tree (or the prompt, at the prefill)."""

    tokens: torch.Tensor  # (N+1,) long: the tree's tokens, root first (the prefill: the prompt chunk)
    candidates: torch.Tensor  # (N+1, k) long: the model's top-k after each node, best first
    correct: torch.Tensor | None  # (N+1,) bool: node's token is what the model chose after its parent
    tree: TreeBuffers | None  # the merged tree's buffers; None at the prefill
    known_right_paths: list[bool] | None = None  # right_paths, where verification found them already

    @cached_property
    def right_paths(self) -> list[bool]:
        """Per merged node, whether it and all its ancestors are right (the root is); on the host."""
        if self.known_right_paths is not None:
            return self.known_right_paths
        return self.tree.right_paths(self.correct)


@dataclass(frozen=True)
class Placement:
    """Where a drafter's nodes sit in the merged tree: its node i > 0 is merged node nodes[i - 1],
    or -1 where a planner left it out (a placed node's parent is always placed)."""

    nodes: tuple[int, ...]

    @classmethod
    def contiguous(cls, start: int, count: int) -> Placement:
        return cls(tuple(range(start, start + count)))

    def merged(self, node: int) -> int:
        """The merged index of the drafter's node (0, the root, stays 0)."""
        return 0 if node == 0 else self.nodes[node - 1]

    def select(self, values: torch.Tensor) -> torch.Tensor:
        """The entries of the root and of this drafter's placed nodes, in its own node order."""
        index = [0, *(m for m in self.nodes if m >= 0)]
        return values[torch.tensor(index, dtype=torch.long, device=values.device)]


class Drafter(ABC):
    """A source of draft tokens."""

    # The source's name where its work is counted (step events, the server's metrics).
    name: str = "draft"
    # Whether `learn` wants the prompt's top-k candidates at the prefill: the decoder's
    # PrefillLearning says of which positions (every one costs the head and a top-k per token).
    learns_from_prefill: bool = False

    @abstractmethod
    def propose(self, root: int) -> Draft | None:
        """The draft for the next step, whose root token is `root`; None to draft nothing."""

    def learn(self, verification: Verification, placement: Placement | None) -> None:  # noqa: B027 - a hook
        """After a forward pass: `placement` says where this drafter's nodes were (None when it
        drafted nothing this step, and at the prefill)."""

    def extend(self, tokens: list[int]) -> None:  # noqa: B027 - a hook
        """Tokens joined the conversation (the prompt, or emitted ones)."""

    def reset(self) -> None:  # noqa: B027 - a hook
        """A new conversation starts."""

    def rewind(self, kept: list[int]) -> None:
        """The conversation was cut back to `kept`, a prefix of it (a client resent an earlier
        part and went another way). By default: the old conversation ends, `kept` is fed anew."""
        self.reset()
        self.extend(kept)

    @property
    @abstractmethod
    def max_nodes(self) -> int:
        """The most draft nodes one proposal can hold."""

    @property
    @abstractmethod
    def max_depth(self) -> int:
        """The deepest node a proposal can hold (how far past the cache a step's positions reach)."""

    @abstractmethod
    def describe(self) -> str:
        """One phrase for banners and reports, e.g. 'lookup chain 10'."""
