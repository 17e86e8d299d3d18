"""Prompt lookup's index: the tokens that followed an earlier occurrence of the context's tail."""

from __future__ import annotations

DEFAULT_NGRAM = 3


class PromptLookup:
    """An n-gram index over one conversation's tokens, updated as tokens arrive (O(n) per token).

    For each n-gram the index keeps the end position of its latest occurrence that already has a
    following token, so a proposal is always a true continuation seen earlier in the conversation.
    """

    def __init__(self, max_ngram: int = DEFAULT_NGRAM, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            # The n-grams ending just before this token now have a continuation: index them.
            end = len(self.tokens) - 1
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n + 1 < 0:
                    break
                self._last_end[tuple(self.tokens[end - n + 1 : end + 1])] = end
            self.tokens.append(token)

    def propose(self, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the longest earlier match of the tail; [] if none."""
        size = len(self.tokens)
        for n in range(min(self.max_ngram, size), self.min_ngram - 1, -1):
            end = self._last_end.get(tuple(self.tokens[size - n :]))
            if end is not None:
                return self.tokens[end + 1 : end + 1 + max_tokens]
        return []
