"""A grammar for core tests, without a grammar engine: after a path of tokens it allows the
tokens `rule(path)` gives; nothing forced, no turns (subclasses say otherwise)."""

from __future__ import annotations

import torch

from tr_cli.core.constraint import ConstraintError, TokenConstraint, Turns


class SetConstraint(TokenConstraint):
    def __init__(self, rule, vocab: int) -> None:
        self.rule, self.vocab, self.path = rule, vocab, []

    def allows(self, token: int) -> bool:
        return token in self.rule(tuple(self.path))

    def allowed(self) -> torch.Tensor:
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        mask[list(self.rule(tuple(self.path)))] = True
        return mask

    def advance(self, token: int) -> None:
        if not self.allows(token):
            raise ConstraintError(f"{token} refused")
        self.path.append(token)

    def rollback(self, count: int) -> None:
        del self.path[len(self.path) - count :]

    def forced(self) -> list[int]:
        return []

    def turns(self, limit: int) -> Turns:
        return Turns([], closing=True)

    def certain(self, tokens: list[int]) -> int:
        return 0
