"""The recycled store: token streams of earlier conversations, indexed by their n-grams, so that a
new conversation can draft what followed the same words before.

The matrix remembers one step of context (the latest top-k after each token); the store remembers
whole passages: prompts that come back (agent loops, code assistants resending a file), answers
the model has given before, boilerplate. It is bounded: past `capacity` tokens the oldest
conversations go first.

The index keeps, for each n in ORDERS, a sorted array of the n-grams' keys (two 31-bit polynomial
hashes side by side, checked against the tokens on a hit) and where each n-gram ended. A lookup
is a binary search per order, longest first (~0.1 ms). The arrays take 12 bytes per token and
order (48 MB for a full store) and are rebuilt, when a conversation has joined, at the next lookup:
about a second per million tokens on this 2-core CPU, 40 ms for the shipped 29 k-token starter. A
dict of n-gram tuples would hold ~150 bytes per entry; a suffix automaton would answer any match
length but needs a per-token Python build at this scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafters.continuation_tree import Continuation

ORDERS = (2, 3, 5, 8)  # n-gram lengths indexed, matched longest first
DEFAULT_CAPACITY = 1_000_000  # tokens (4 MB on disk as int32)
MIN_DOCUMENT = 8  # shorter conversations teach nothing worth a slot
_MOD = (1 << 31) - 1
_BASE1, _BASE2 = 1_000_003, 999_983
_SEPARATOR = -1


@dataclass(frozen=True)
class Document:
    tokens: torch.Tensor  # (n,) int32 on the CPU
    stamp: int  # microseconds since the epoch, when it was added


def _key(window: list[int]) -> int:
    h1 = h2 = 0
    for token in window:
        h1 = (h1 * _BASE1 + token) % _MOD
        h2 = (h2 * _BASE2 + token) % _MOD
    return (h1 << 31) | h2


def _keys(windows: torch.Tensor) -> torch.Tensor:
    """_key of every row of `windows` (rows of n tokens), vectorized."""
    h1 = torch.zeros(windows.shape[0], dtype=torch.long)
    h2 = torch.zeros_like(h1)
    for j in range(windows.shape[1]):
        h1 = (h1 * _BASE1 + windows[:, j]) % _MOD
        h2 = (h2 * _BASE2 + windows[:, j]) % _MOD
    return (h1 << 31) | h2


class RecycledStore:
    def __init__(self, vocab_size: int, documents: list[Document] | None = None, capacity: int = DEFAULT_CAPACITY):
        if capacity < MIN_DOCUMENT:
            raise ValueError(f"store capacity must be at least {MIN_DOCUMENT} tokens, got {capacity}")
        self.vocab_size = vocab_size
        self.capacity = capacity
        self.documents: list[Document] = []
        self.added: list[Document] = []  # added by this process, not yet saved
        self._tokens = 0
        self._index: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._stream = torch.zeros(0, dtype=torch.long)
        for doc in documents or []:
            self._append(doc)

    @property
    def total_tokens(self) -> int:
        return self._tokens

    def _append(self, doc: Document) -> None:
        self.documents.append(doc)
        self._tokens += doc.tokens.numel()
        while self._tokens > self.capacity and len(self.documents) > 1:
            self._tokens -= self.documents.pop(0).tokens.numel()
        self._index = None

    def add(self, tokens: list[int] | torch.Tensor, stamp: int) -> bool:
        """Remember a conversation (False, and nothing stored, when it is too short or has ids
        outside the vocabulary). A conversation that continues the one added just before (a chat
        re-read from its start) replaces it, so its text is not stored twice."""
        t = torch.as_tensor(tokens, dtype=torch.long).flatten()
        if t.numel() < MIN_DOCUMENT or int(t.min()) < 0 or int(t.max()) >= self.vocab_size:
            return False
        t = t[-self.capacity :].to(torch.int32)
        if self.added and self.documents and self.documents[-1] is self.added[-1]:
            last = self.added[-1].tokens
            if last.numel() <= t.numel() and torch.equal(last, t[: last.numel()]):
                self.added.pop()
                self._tokens -= self.documents.pop().tokens.numel()
        doc = Document(t, stamp)
        self._append(doc)
        self.added.append(doc)
        return True

    def copy(self) -> RecycledStore:
        twin = RecycledStore(self.vocab_size, capacity=self.capacity)
        twin.documents, twin._tokens = list(self.documents), self._tokens
        twin._index, twin._stream = self._index, self._stream  # immutable once built
        return twin

    def _build(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        sep = torch.tensor([_SEPARATOR], dtype=torch.long)
        parts = []
        for doc in self.documents:
            parts += [doc.tokens.long(), sep]
        stream = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        index = {}
        for n in ORDERS:
            if stream.numel() < n + 1:
                continue
            windows = stream[:-1].unfold(0, n, 1)  # window j ends at j + n - 1 and has a next token
            ends = torch.arange(n - 1, stream.numel() - 1)
            ok = (windows >= 0).all(dim=1) & (stream[ends + 1] >= 0)
            keys, order = torch.sort(_keys(windows[ok]), stable=True)  # equal keys: older first
            index[n] = (keys, ends[ok][order].to(torch.int32))
        self._stream = stream
        return index

    def continuations(self, context: list[int], depth: int, limit: int) -> list[Continuation]:
        """Up to `limit` stored continuations of the context's tail, longest match first, then
        the most recent, each at most `depth` tokens."""
        if not self.documents:
            return []
        if self._index is None:
            self._index = self._build()
        out: list[Continuation] = []
        used: set[int] = set()
        stream = self._stream
        for n in reversed(ORDERS):
            if len(context) < n or n not in self._index:
                continue
            keys, ends = self._index[n]
            tail = context[-n:]
            key = torch.tensor([_key(tail)])
            lo = int(torch.searchsorted(keys, key))
            hi = int(torch.searchsorted(keys, key, right=True))
            for end in reversed(ends[lo:hi][-4 * limit :].tolist()):
                if end in used or stream[end - n + 1 : end + 1].tolist() != tail:
                    continue  # already taken at a longer match, or a hash collision
                used.add(end)
                following = stream[end + 1 : end + 1 + depth].tolist()
                if _SEPARATOR in following:
                    following = following[: following.index(_SEPARATOR)]
                out.append(Continuation(n, tuple(following)))
                if len(out) == limit:
                    return out
        return out
