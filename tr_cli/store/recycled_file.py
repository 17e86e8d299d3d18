"""The recycled store on disk: the token streams of earlier conversations, beside their matrix
file (`<matrix stem>.store.safetensors`).

safetensors (loading runs no code) with three tensors: `tokens` (int32, every document
concatenated, oldest first), `ends` (int64, cumulative end offsets, one per document) and `stamps`
(int64, when each document was added, microseconds since the epoch), plus string metadata. Saves
merge under the file's lock: what the file holds by then plus this process's additions, ordered
by stamp, the oldest evicted past the capacity; written atomically, so two `tr` processes keep
each other's conversations and a crash never leaves half a file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import __version__
from ..core.recycled_store import DEFAULT_CAPACITY, MIN_DOCUMENT, Document, RecycledStore
from ..errors import StoreFileError
from .atomic import atomic_write, locked, move_aside
from .matrix_file import OTHER_MODEL, RECYCLED_STORE_SUFFIX, check_fingerprint
from .remedies import FixableError, Remedy
from .safetensors_file import StringMetadata, read_safetensors

FORMAT_VERSION = 1
_TOKENS, _ENDS, _STAMPS = "tokens", "ends", "stamps"


def recycled_store_path(matrix_path: Path) -> Path:
    """Where the recycled store of a matrix file lives:
    `abc-v49152-k8.safetensors` -> `abc-v49152-k8.store.safetensors`."""
    matrix_path = Path(matrix_path)
    return matrix_path.with_name(matrix_path.stem + RECYCLED_STORE_SUFFIX)


@dataclass(frozen=True)
class RecycledStoreMeta(StringMetadata):
    vocab_size: int
    fingerprint: str
    model_id: str
    capacity: int = DEFAULT_CAPACITY
    format_version: int = FORMAT_VERSION
    tr_version: str = __version__


@dataclass
class RecycledStoreFile:
    meta: RecycledStoreMeta
    documents: list[Document]  # oldest first

    @property
    def total_tokens(self) -> int:
        return sum(doc.tokens.numel() for doc in self.documents)

    def to_store(self) -> RecycledStore:
        return RecycledStore(self.meta.vocab_size, self.documents, capacity=self.meta.capacity)


def read_recycled_store(path: Path) -> RecycledStoreFile:
    """Load and validate a recycled store file; StoreFileError (one line) for anything unusable."""
    meta, tensors = read_safetensors(
        path, (_TOKENS, _ENDS, _STAMPS), RecycledStoreMeta.from_strings, "recycled store", StoreFileError
    )
    tokens, ends, stamps = tensors[_TOKENS], tensors[_ENDS], tensors[_STAMPS]
    if meta.format_version > FORMAT_VERSION:
        raise StoreFileError(
            f"{path}: recycled store format {meta.format_version} is newer than this tr understands; upgrade tr"
        )
    if meta.capacity < MIN_DOCUMENT or meta.vocab_size < 1:
        raise StoreFileError(
            f"{path}: metadata says capacity {meta.capacity}, vocabulary {meta.vocab_size} (corrupt file)"
        )
    if tokens.dtype != torch.int32 or tokens.dim() != 1:
        raise StoreFileError(f"{path}: tokens tensor is {tokens.dtype} {tuple(tokens.shape)}, expected 1-D int32")
    if ends.dtype != torch.int64 or ends.dim() != 1 or stamps.dtype != torch.int64 or stamps.shape != ends.shape:
        raise StoreFileError(
            f"{path}: ends {ends.dtype} {tuple(ends.shape)} and stamps {stamps.dtype} {tuple(stamps.shape)} "
            "must be int64 with one entry per document"
        )
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), ends[:-1]])
    if ends.numel() and (bool((ends <= starts).any()) or int(ends[-1]) != tokens.numel()):
        raise StoreFileError(
            f"{path}: document ends do not increase to the {tokens.numel():,} stored tokens (corrupt file)"
        )
    if not ends.numel() and tokens.numel():
        raise StoreFileError(f"{path}: {tokens.numel():,} tokens but no document ends (corrupt file)")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= meta.vocab_size):
        raise StoreFileError(f"{path}: recycled store holds token ids outside the vocabulary (corrupt file)")
    lengths = (ends - starts).tolist()
    documents = [Document(t, int(s)) for t, s in zip(torch.split(tokens, lengths), stamps.tolist(), strict=True)]
    return RecycledStoreFile(meta, documents)


def write_recycled_store(path: Path, data: RecycledStoreFile) -> None:
    """Serialize and write atomically (callers hold `locked(path)` when they merge)."""
    from safetensors.torch import save

    docs = data.documents
    tokens = torch.cat([doc.tokens.to(torch.int32) for doc in docs]) if docs else torch.zeros(0, dtype=torch.int32)
    ends = torch.tensor([doc.tokens.numel() for doc in docs], dtype=torch.int64).cumsum(0)
    stamps = torch.tensor([doc.stamp for doc in docs], dtype=torch.int64)
    payload = save(
        {_TOKENS: tokens.contiguous(), _ENDS: ends.contiguous(), _STAMPS: stamps}, metadata=data.meta.to_strings()
    )
    atomic_write(Path(path), payload)


def check_recycled_store_compatible(
    meta: RecycledStoreMeta, fingerprint: str, vocab_size: int, path: Path, remedies: tuple[Remedy, ...] = OTHER_MODEL
) -> None:
    """A recycled store may serve a model only with its tokenizer's token ids; a FixableError
    (with `remedies`) otherwise."""
    if meta.vocab_size != vocab_size:
        raise FixableError(
            f"{path}: recycled store is for a vocabulary of {meta.vocab_size:,} but this model has {vocab_size:,}",
            remedies,
        )
    check_fingerprint("recycled store", meta.fingerprint, meta.model_id, fingerprint, path, remedies)


def merge_documents(base: list[Document], incoming: list[Document], vocab_size: int, capacity: int) -> list[Document]:
    """`base` plus the `incoming` documents it does not hold yet (same stamp and length: already
    there), ordered by stamp, the oldest evicted past `capacity` (RecycledStore's rule)."""
    held = {(doc.stamp, doc.tokens.numel()) for doc in base}
    new = [doc for doc in incoming if (doc.stamp, doc.tokens.numel()) not in held]
    ordered = sorted([*base, *new], key=lambda doc: doc.stamp)  # stable: equal stamps keep file order
    return RecycledStore(vocab_size, ordered, capacity=capacity).documents


def save_recycled_store(
    path: Path,
    store: RecycledStore,
    fingerprint: str,
    model_id: str,
    fallback: Path | None = None,
    waiting: Callable[[str], None] | None = None,
) -> RecycledStoreFile | None:
    """Merge `store.added` into the file under its lock and clear it; None when nothing was added.

    Without a file yet, the merge starts from `fallback` (the starter store a seeded matrix came
    with) when given. An unreadable file is moved aside (`.corrupt-<us>`), never overwritten; a
    file of another tokenizer is refused (StoreError) and left as it is.
    """
    added = list(store.added)
    if not added:
        return None
    path = Path(path)
    meta = RecycledStoreMeta(store.vocab_size, fingerprint, model_id, capacity=store.capacity)
    with locked(path, waiting=waiting):
        base: list[Document] = []
        if path.exists():
            try:
                current = read_recycled_store(path)
            except StoreFileError:
                move_aside(path)
            else:
                check_recycled_store_compatible(current.meta, fingerprint, store.vocab_size, path)
                base = current.documents
        elif fallback is not None and Path(fallback).exists():
            base = read_recycled_store(fallback).documents
        result = RecycledStoreFile(meta, merge_documents(base, added, store.vocab_size, store.capacity))
        write_recycled_store(path, result)
    del store.added[: len(added)]  # exactly what was written
    return result


def copy_recycled_store_file(source: Path, target: Path) -> RecycledStoreFile:
    """Validate `source`, then write its exact bytes to `target` atomically."""
    data = read_recycled_store(source)
    atomic_write(Path(target), Path(source).read_bytes())
    return data


def with_fingerprint(data: RecycledStoreFile, fingerprint: str) -> RecycledStoreFile:
    """The same documents labelled for another tokenizer (an import told to take them as its own)."""
    return RecycledStoreFile(replace(data.meta, fingerprint=fingerprint), data.documents)
