"""A model's tokens as bytes and back: what drafting from text needs of a tokenizer, which the
core never loads itself (text/ gives one)."""

from __future__ import annotations

from abc import ABC, abstractmethod


class TokenText(ABC):
    @abstractmethod
    def piece(self, token: int) -> bytes:
        """The bytes `token` stands for (a special token's name for special ones)."""

    @abstractmethod
    def encode(self, text: bytes) -> list[int]:
        """`text` as the model's tokenizer splits it."""
