"""Prompt lookup on text, not tokens: what followed the reply's tail where that text occurred
earlier in the conversation, re-tokenized the way the model writes it.

Token lookup misses a copy whenever the same text is split into other tokens, which is the rule
in structured replies: a paragraph's ` Priya Raman` (space-led tokens) becomes `"P`, `ri`, `ya`,
` Raman` after a JSON string's opening quote. Matching bytes instead, and tokenizing the earlier
text that followed the match together with the reply's last token, drafts the copy in the
model's own tokens. A short match counts only where it starts a word on both sides (a value's
first letters after a quote, a word after a space), so one letter does not match every word.
"""

from __future__ import annotations

from bisect import bisect_left

import torch

from ..design.source_stats import SourceStats
from ..token_text import TokenText
from .continuation_drafter import ContinuationDrafter
from .continuation_tree import Continuation

TEXT_DEPTH = 10  # tokens drafted per continuation
TEXT_BRANCHES = 4  # earlier occurrences folded into one draft
TEXT_PRIOR = 0.45
LONGEST_MATCH = 32  # bytes of the tail matched at most
WORD_MATCH = 4  # a match shorter than this many bytes must start a word on both sides
FOLLOWING_BYTES = 64  # earlier text re-tokenized per continuation


def word_byte(byte: int) -> bool:
    """A letter or digit, or a byte of a character past ASCII (part of a word in most scripts)."""
    return byte >= 128 or chr(byte).isalnum()


def starts_word(text: bytearray, at: int) -> bool:
    """Whether a word starts at `at`: a word byte there, and the text starts there or a non-word
    byte precedes it."""
    return word_byte(text[at]) and (at == 0 or not word_byte(text[at - 1]))


class TextLookupDrafter(ContinuationDrafter):
    name = "text"

    def __init__(
        self,
        text: TokenText,
        length: int = TEXT_DEPTH,
        device: torch.device | str = "cpu",
        branches: int = TEXT_BRANCHES,
        stats: SourceStats | None = None,
    ) -> None:
        super().__init__(length, branches, length * branches, stats or SourceStats(TEXT_PRIOR), device)
        self.token_text = text
        self._text = bytearray()  # the conversation so far
        self._starts: list[int] = []  # where each token's bytes start in it
        self._tokens: list[int] = []

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self._starts.append(len(self._text))
            self._tokens.append(token)
            self._text += self.token_text.piece(token)

    def reset(self) -> None:
        self._text, self._starts, self._tokens = bytearray(), [], []

    def continuations(self, depth: int, limit: int) -> list[Continuation]:
        text, size = self._text, len(self._text)
        if not self._tokens or size == 0:
            return []
        last = self._tokens[-1]
        last_bytes = bytes(text[self._starts[-1] :])
        out: list[Continuation] = []
        used: set[int] = set()  # where continuations start: one per place
        for length in range(min(LONGEST_MATCH, size - 1), 0, -1):
            tail_start = size - length
            short = length < WORD_MATCH
            if short and not starts_word(text, tail_start):
                continue
            suffix = bytes(text[tail_start:])
            end = size - 1  # an occurrence must end before the tail does
            while len(out) < limit:
                at = text.rfind(suffix, 0, end)
                if at < 0:
                    break
                end = at + length - 1
                follows = at + length
                if follows in used or (short and not starts_word(text, at)):
                    continue
                used.add(follows)
                tokens = self._following(last, last_bytes, bytes(text[follows : follows + FOLLOWING_BYTES]))
                if tokens:
                    matched = max(len(self._starts) - bisect_left(self._starts, tail_start), 1)
                    out.append(Continuation(matched, tuple(tokens[:depth])))
            if len(out) == limit:
                break
        return out

    def _following(self, last: int, last_bytes: bytes, following: bytes) -> list[int]:
        """`following` in the model's tokens, as written after the token `last`: tokenized with
        `last`'s bytes in front, so a word split across them comes out as the model splits it."""
        if not following:
            return []
        tokens = self.token_text.encode(last_bytes + following)
        if tokens and tokens[0] == last:
            tokens = tokens[1:]
        else:  # the tail was not split canonically: the following text on its own
            tokens = self.token_text.encode(following)
        return tokens[:-1]  # the last may be a word cut short

    def describe(self) -> str:
        return f"text lookup {self.depth}x{self.branches}"
