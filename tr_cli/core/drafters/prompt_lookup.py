"""Prompt lookup's index: the tokens that followed earlier occurrences of the context's tail."""

from __future__ import annotations

from .continuation_tree import Continuation

DEFAULT_NGRAM = 4
RECENT_ENDS = 4  # occurrences kept per n-gram: the latest ones, each a candidate continuation


class PromptLookup:
    """An n-gram index over one conversation's tokens, updated as tokens arrive (O(n) per token).

    For each n-gram the index keeps the end positions of its latest occurrences that already have
    a following token, so a proposal is always a true continuation seen earlier in the conversation.
    """

    def __init__(self, max_ngram: int = DEFAULT_NGRAM, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            # The n-grams ending just before this token now have a continuation: index them.
            end = len(self.tokens) - 1
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n + 1 < 0:
                    break
                ends = self._ends.setdefault(tuple(self.tokens[end - n + 1 : end + 1]), [])
                ends.append(end)
                if len(ends) > RECENT_ENDS:
                    del ends[0]
            self.tokens.append(token)

    def continuations(self, max_tokens: int, limit: int) -> list[Continuation]:
        """Up to `limit` continuations of the tail, longest match first, then the most recent."""
        size = len(self.tokens)
        out: list[Continuation] = []
        used: set[int] = set()
        for n in range(min(self.max_ngram, size), self.min_ngram - 1, -1):
            for end in reversed(self._ends.get(tuple(self.tokens[size - n :]), ())):
                if end not in used:
                    used.add(end)
                    out.append(Continuation(n, tuple(self.tokens[end + 1 : end + 1 + max_tokens])))
                    if len(out) == limit:
                        return out
        return out

    def propose(self, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the longest, latest match of the tail; [] if none."""
        found = self.continuations(max_tokens, 1)
        return list(found[0].tokens) if found else []
