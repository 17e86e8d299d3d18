"""The recycled store: token streams of earlier conversations, indexed by their n-grams, so that a
new conversation can draft what followed the same words before.

The matrix remembers one step of context (the latest top-k after each token); the store remembers
whole passages: prompts that come back (agent loops, code assistants resending a file), answers
the model has given before, boilerplate. It is bounded: past `capacity` tokens the oldest
conversations go first.

The index keeps, for each n in ORDERS, a sorted array of the n-grams' keys (two 31-bit polynomial
hashes side by side, checked against the tokens on a hit) and where each n-gram ended. A lookup
is a binary search per order, longest first (~0.1 ms). The arrays take 12 bytes per token and
order (48 MB for a full store). A conversation that joins is indexed on its own, as one more part,
at the next lookup; a removal (the oldest past the capacity, a chat re-read from its start) or too
many parts rebuild the whole: about a second per million tokens on this 2-core CPU, 40 ms for the
shipped 29 k-token starter. A
dict of n-gram tuples would hold ~150 bytes per entry; a suffix automaton would answer any match
length but needs a per-token Python build at this scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .drafters.continuation_tree import Continuation

ORDERS = (2, 3, 5, 8)  # n-gram lengths indexed, matched longest first
MAX_PARTS = 16  # index parts before the next lookup rebuilds them as one
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
        # The index, in parts (oldest first), each over a run of documents: per order, sorted keys and
        # their n-grams' ends in the stream. A conversation that joins adds a part over its own tokens
        # at the next lookup (a whole rebuild took ~40 ms for the 29 k-token starter, once per
        # conversation); a removal, or many parts, rebuilds it whole. numpy views of torch's arrays:
        # a lookup slices them ~100 times (~0.5 µs a slice, not ~5).
        self._parts: list[dict[int, tuple[np.ndarray, np.ndarray]]] | None = None
        self._indexed = 0  # documents[:_indexed] are in the parts and the stream
        self._stream = np.zeros(0, dtype=np.int64)
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
            self._parts = None  # the stream's offsets moved

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
                self._parts = None
        doc = Document(t, stamp)
        self._append(doc)
        self.added.append(doc)
        return True

    def copy(self) -> RecycledStore:
        twin = RecycledStore(self.vocab_size, capacity=self.capacity)
        twin.documents, twin._tokens = list(self.documents), self._tokens
        # Parts and stream are replaced, never changed in place, so the twin may share them.
        twin._parts, twin._indexed, twin._stream = self._parts, self._indexed, self._stream
        return twin

    def _refresh(self) -> list[dict[int, tuple[np.ndarray, np.ndarray]]]:
        """The index parts over every document: a new part over the documents that joined since the
        last lookup, or (after a removal, or past MAX_PARTS) one part over all of them."""
        if self._parts is not None and self._indexed == len(self.documents):
            return self._parts
        if self._parts is None or len(self._parts) >= MAX_PARTS:
            part, stream = _index_of(self.documents, 0)
            self._parts, self._stream = [part], stream
        else:
            part, stream = _index_of(self.documents[self._indexed :], len(self._stream))
            self._parts, self._stream = [*self._parts, part], np.concatenate([self._stream, stream])
        self._indexed = len(self.documents)
        return self._parts

    def continuations(self, context: list[int], depth: int, limit: int) -> list[Continuation]:
        """Up to `limit` stored continuations of the context's tail, longest match first, then
        the most recent, each at most `depth` tokens."""
        if not self.documents:
            return []
        parts = self._refresh()
        out: list[Continuation] = []
        used: set[int] = set()
        stream = self._stream
        for n in reversed(ORDERS):
            if len(context) < n:
                continue
            tail = context[-n:]
            for end in _matches(parts, n, _key(tail), 4 * limit):
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


def _index_of(documents: list[Document], offset: int) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """An index part over `documents`, their stream starting at `offset` of the whole: per order,
    the n-grams' keys sorted (equal keys: older first) and where each ended; and that stream (each
    document followed by a separator, so no n-gram spans two documents or two parts)."""
    sep = torch.tensor([_SEPARATOR], dtype=torch.long)
    pieces = []
    for doc in documents:
        pieces += [doc.tokens.long(), sep]
    stream = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
    index = {}
    for n in ORDERS:
        if stream.numel() < n + 1:
            continue
        windows = stream[:-1].unfold(0, n, 1)  # window j ends at j + n - 1 and has a next token
        ends = torch.arange(n - 1, stream.numel() - 1)
        ok = (windows >= 0).all(dim=1) & (stream[ends + 1] >= 0)
        keys, order = torch.sort(_keys(windows[ok]), stable=True)
        index[n] = (keys.numpy(), (ends[ok][order] + offset).to(torch.int32).numpy())
    return index, stream.numpy()


def _matches(parts: list[dict[int, tuple[np.ndarray, np.ndarray]]], n: int, key: int, most: int) -> list[int]:
    """Ends of the n-grams with this key, newest first, at most `most` of them."""
    found: list[int] = []
    for part in reversed(parts):
        if n not in part:
            continue
        keys, ends = part[n]
        lo = int(np.searchsorted(keys, key))
        hi = int(np.searchsorted(keys, key, side="right"))
        found += reversed(ends[max(lo, hi - (most - len(found))) : hi].tolist())
        if len(found) >= most:
            break
    return found
