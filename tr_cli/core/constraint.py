"""Constrained decoding inside Token Recycling: what the decoder needs from a grammar, and the
rules that keep the output exactly constrained `generate`'s.

`generate` with a logits processor that sets every token the grammar forbids to -inf (applied
after the repetition penalty, before temperature and the other warpers, as transformers orders a
caller's processors) picks, at every position, the best allowed token (greedy) or samples the
processed distribution over allowed tokens. Token Recycling keeps that exactly:

- before the forward, every draft node whose token the grammar forbids after its path is cut from
  the tree, with its subtree (it could never be accepted: the token chosen at its parent is always
  allowed), so it costs neither forward time nor the source's acceptance record;
- after it, the acceptance walk goes down from the root with the grammar following it: at each
  visited node the masked choice (greedy: `masked_argmax`; sampling: the masked distribution) is
  made and the grammar advances by it, whether it matches a child (accepted) or not (the bonus).

The grammar engine itself lives outside the core (text/grammar.py); the core sees this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from .token_text import TokenText
from .tree import TreeSpec


class ConstraintError(RuntimeError):
    """The grammar refused a token it should have allowed, or has no allowed token left."""


class Turns(NamedTuple):
    """Where nothing is forced, the tokens after which the grammar forces a run again."""

    tokens: list[int]
    # True: they close a value that may also go on (a quote ending a string, a comma after a
    # number); False: they are the choices themselves (`true` or `false`, an enum's values).
    closing: bool


class TokenConstraint(ABC):
    """A grammar's state over the tokens emitted so far, with undo for exploring a draft tree."""

    # The tokens' bytes under the grammar's tokenizer, for drafting from text (structured replies
    # copy their input in other tokens); None: drafted from tokens only.
    token_text: TokenText | None = None

    @abstractmethod
    def allows(self, token: int) -> bool:
        """Whether `token` may come next."""

    @abstractmethod
    def allowed(self) -> torch.Tensor:
        """(V,) bool on the CPU: every token that may come next (the model's output vocabulary)."""

    @abstractmethod
    def advance(self, token: int) -> None:
        """`token` comes next; ConstraintError when the grammar forbids it."""

    @abstractmethod
    def rollback(self, count: int) -> None:
        """Undo the last `count` advances."""

    @abstractmethod
    def forced(self) -> list[int]:
        """Tokens the grammar leaves no choice but to write next (a key, a quote, a brace): a draft
        that costs no model work to propose. Where the forced text goes on but a longer token could
        still take its end (`": "` then ` "` or ` ""`), that end follows in the tokenizer's own
        split: likely, not certain (see `certain`). Empty when the next token is open."""

    @abstractmethod
    def turns(self, limit: int) -> Turns:
        """Where nothing is forced: at most `limit` tokens after which the grammar forces a run
        again or may end, as draft branches — the words of a choice (`true`/`false`, an enum's
        values: the longest first token of each), or the tokens that close the open value (a
        closing quote, a comma after a number)."""

    @abstractmethod
    def certain(self, tokens: list[int]) -> int:
        """How many of `tokens` (a forced run) are, one after another, the only token the grammar
        allows: whatever the model prefers, constrained decoding writes exactly those."""


def masked_argmax(row: torch.Tensor, values: list[float], indices: list[int], constraint: TokenConstraint) -> int:
    """Exactly `row.masked_fill(~allowed, -inf).argmax()` (first index among equal maxima), read
    from the row's top-k `values`/`indices` (best first) whenever an allowed token is among them
    (almost always: checking a few tokens costs microseconds, a whole mask more)."""
    k = len(values)
    start = 0
    while start < k:
        end = start
        while end < k and values[end] == values[start]:
            end += 1
        if end == k and k < row.shape[-1]:
            break  # the tie may go on past the top-k: only the whole row can say
        allowed = [token for token in indices[start:end] if constraint.allows(token)]
        if allowed:
            return min(allowed)
        start = end
    mask = constraint.allowed().to(row.device)
    if not bool(mask.any()):
        raise ConstraintError("the grammar allows no token here")
    return int(row.masked_fill(~mask, float("-inf")).argmax())


def allowed_nodes(spec: TreeSpec, tokens: list[int], constraint: TokenConstraint) -> list[int]:
    """The nodes of a draft tree (root first, in node order) whose whole path the grammar allows
    after its current state, which it is left in."""
    children = spec.children
    keep = [0]

    def visit(node: int) -> None:
        for child in children[node]:
            if constraint.allows(tokens[child]):
                keep.append(child)
                if children[child]:
                    constraint.advance(tokens[child])
                    visit(child)
                    constraint.rollback(1)

    visit(0)
    return sorted(keep)
