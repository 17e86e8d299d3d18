"""The recycled store: token streams of earlier conversations, indexed by their n-grams, so that a
new conversation can draft what followed the same words before.

The matrix remembers one step of context (the latest top-k after each token); the store remembers
whole passages: prompts that come back (agent loops, code assistants resending a file), answers
the model has given before, boilerplate. It is bounded: past `capacity` tokens the oldest
conversations go first.

The index keeps one sorted array of keys per part: each n-gram's key (its order in the top bits,
two 30-bit polynomial hashes below, checked against the tokens on a hit) and where the n-gram
ended, for every n in ORDERS. A lookup is one vectorized binary search per part for all orders
(~30 us for one part). The arrays take 12 bytes per token and order (48 MB for a full store). A
conversation that joins is indexed on its own, as one more part, at the next lookup, and the
newest parts merge while they are about as large as the one before (as a binary counter carries):
a few parts, each token re-indexed a few times. A removal (the oldest past the capacity, a chat
re-read from its start) rebuilds the whole: about a second per million tokens on this 2-core CPU,
40 ms for the shipped 29 k-token starter. A dict of n-gram tuples would hold ~150 bytes per entry;
a suffix automaton would answer any match length but needs a per-token Python build at this scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .drafters.continuation_tree import Continuation

ORDERS = (2, 3, 5, 8)  # n-gram lengths indexed, matched longest first
DEFAULT_CAPACITY = 1_000_000  # tokens (4 MB on disk as int32)
MIN_DOCUMENT = 8  # shorter conversations teach nothing worth a slot
_MOD1, _MOD2 = (1 << 30) - 35, (1 << 30) - 41  # primes below 2^30
_BASE1, _BASE2 = 1_000_003, 999_983
_SEPARATOR = -1
_ORDER_TAG = {n: i for i, n in enumerate(ORDERS)}  # a key's top bits: which order it is of


@dataclass(frozen=True)
class Document:
    tokens: torch.Tensor  # (n,) int32 on the CPU
    stamp: int  # microseconds since the epoch, when it was added


def _tail_keys(context: list[int]) -> list[tuple[int, int]]:
    """(n, key) of the context's last n tokens for each n in ORDERS it is long enough for, longest
    first. The hashes weigh the last token 1, the one before it BASE, and so on (what _keys's
    Horner loop computes), so one pass from the end serves every order."""
    h1 = h2 = 0
    p1 = p2 = 1
    keys = {}
    for n, token in enumerate(reversed(context[-max(ORDERS) :]), start=1):
        h1, h2 = (h1 + token * p1) % _MOD1, (h2 + token * p2) % _MOD2
        p1, p2 = p1 * _BASE1 % _MOD1, p2 * _BASE2 % _MOD2
        if n in _ORDER_TAG:
            keys[n] = (_ORDER_TAG[n] << 60) | (h1 << 30) | h2
    return [(n, keys[n]) for n in reversed(ORDERS) if n in keys]


def _keys(windows: torch.Tensor) -> torch.Tensor:
    """The key of every row of `windows` (rows of n tokens, n in ORDERS), vectorized."""
    h1 = torch.zeros(windows.shape[0], dtype=torch.long)
    h2 = torch.zeros_like(h1)
    for j in range(windows.shape[1]):
        h1 = (h1 * _BASE1 + windows[:, j]) % _MOD1
        h2 = (h2 * _BASE2 + windows[:, j]) % _MOD2
    return (_ORDER_TAG[windows.shape[1]] << 60) | (h1 << 30) | h2


@dataclass(frozen=True)
class _Part:
    """The index over documents[first:] as they were when it was built (a later part covers more)."""

    keys: np.ndarray  # every order's n-gram keys, sorted (equal keys: older first)
    ends: np.ndarray  # int32: where each n-gram ended in the whole stream
    first: int  # its first document
    tokens: int  # how many tokens it covers


class RecycledStore:
    def __init__(self, vocab_size: int, documents: list[Document] | None = None, capacity: int = DEFAULT_CAPACITY):
        if capacity < MIN_DOCUMENT:
            raise ValueError(f"store capacity must be at least {MIN_DOCUMENT} tokens, got {capacity}")
        self.vocab_size = vocab_size
        self.capacity = capacity
        self.documents: list[Document] = []
        self.added: list[Document] = []  # added by this process, not yet saved
        self._tokens = 0
        # The index, in parts (oldest first), each over a run of documents: sorted keys and their
        # n-grams' ends in the stream. A conversation that joins adds a part over its own tokens at
        # the next lookup (a whole rebuild took ~40 ms for the 29 k-token starter, once per
        # conversation); a removal rebuilds it whole. numpy views of torch's arrays: a lookup
        # slices them a few times (~0.5 µs a slice, not ~5).
        self._parts: list[_Part] | None = None
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

    def _refresh(self) -> list[_Part]:
        """The index parts over every document: a new part over the documents that joined since the
        last lookup, merged with the parts before it while they are not much larger, or (after a
        removal) one part over all of them."""
        if self._parts is not None and self._indexed == len(self.documents):
            return self._parts
        if self._parts is None:
            self._stream = _stream_of(self.documents)
            parts = []
        else:
            self._stream = np.concatenate([self._stream, _stream_of(self.documents[self._indexed :])])
            parts = list(self._parts)
        first = self._indexed if parts else 0  # documents[first:] are not indexed yet
        tokens = sum(doc.tokens.numel() for doc in self.documents[first:])
        while parts and parts[-1].tokens <= 2 * tokens:  # a carry: the last part joins the new one
            first, tokens = parts[-1].first, parts[-1].tokens + tokens
            parts.pop()
        parts.append(self._index_part(first, tokens))
        self._parts, self._indexed = parts, len(self.documents)
        return parts

    def _index_part(self, first: int, tokens: int) -> _Part:
        """A part over documents[first:] (`tokens` of them), keyed into the current stream."""
        offset = sum(doc.tokens.numel() + 1 for doc in self.documents[:first])  # each ends in a separator
        stream = torch.from_numpy(self._stream[offset:])
        keys, ends = [], []
        for n in ORDERS:
            if stream.numel() < n + 1:
                continue
            windows = stream[:-1].unfold(0, n, 1)  # window j ends at j + n - 1 and has a next token
            at = torch.arange(n - 1, stream.numel() - 1)
            ok = (windows >= 0).all(dim=1) & (stream[at + 1] >= 0)
            keys.append(_keys(windows[ok]))
            ends.append(at[ok] + offset)
        if not keys:
            return _Part(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), first, tokens)
        sorted_keys, order = torch.sort(torch.cat(keys), stable=True)
        return _Part(sorted_keys.numpy(), torch.cat(ends)[order].to(torch.int32).numpy(), first, tokens)

    def continuations(self, context: list[int], depth: int, limit: int) -> list[Continuation]:
        """Up to `limit` stored continuations of the context's tail, longest match first, then
        the most recent, each at most `depth` tokens."""
        if not self.documents:
            return []
        parts = self._refresh()
        tails = _tail_keys(context)
        if not tails:
            return []
        query = np.array([key for _, key in tails], dtype=np.int64)
        # Per part, newest first: where each order's key starts and ends among its sorted keys.
        spans = [
            (np.searchsorted(part.keys, query).tolist(), np.searchsorted(part.keys, query, side="right").tolist(), part)
            for part in reversed(parts)
        ]
        most = 4 * limit
        out: list[Continuation] = []
        used: set[int] = set()
        stream = self._stream
        for q, (n, _) in enumerate(tails):
            tail = context[-n:]
            for end in _newest_ends(spans, q, most):
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


def _stream_of(documents: list[Document]) -> np.ndarray:
    """The documents' tokens, each followed by a separator (no n-gram spans two documents)."""
    sep = torch.tensor([_SEPARATOR], dtype=torch.long)
    pieces = []
    for doc in documents:
        pieces += [doc.tokens.long(), sep]
    return torch.cat(pieces).numpy() if pieces else np.zeros(0, dtype=np.int64)


def _newest_ends(spans: list[tuple[list[int], list[int], _Part]], q: int, most: int) -> list[int]:
    """Ends of the n-grams matching query q, newest first, at most `most` of them."""
    found: list[int] = []
    for starts, stops, part in spans:
        lo, hi = starts[q], stops[q]
        if hi > lo:
            found += reversed(part.ends[max(lo, hi - (most - len(found))) : hi].tolist())
            if len(found) >= most:
                break
    return found
