"""A matrix file and the recycled store kept beside it, as one pair on disk: which files go
together, the order their locks are taken in, what a rebuild would overwrite, and writing a pair
built from text."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from ..core.matrix import filled_rows
from ..core.recycled_store import RecycledStore
from ..errors import MatrixFileError
from .atomic import locked
from .matrix_file import RECYCLED_STORE_SUFFIX, SUFFIX, MatrixFile, MatrixOwner, read_matrix, write_matrix
from .recycled_file import RecycledStoreFile, RecycledStoreMeta, recycled_store_path, write_recycled_store
from .remedies import FixableError, Remedy
from .timestamps import iso, now_us


def pair_paths(matrix_path: Path) -> tuple[Path, Path]:
    """The matrix file and the recycled store beside it."""
    return Path(matrix_path), recycled_store_path(matrix_path)


def is_recycled_store_name(name: str | Path) -> bool:
    return str(name).endswith(RECYCLED_STORE_SUFFIX)


def matrix_path_of(recycled_store: str | Path) -> Path:
    """The matrix file a recycled store is kept beside (recycled_store_path's inverse)."""
    return Path(str(recycled_store).removesuffix(RECYCLED_STORE_SUFFIX) + SUFFIX)


@contextlib.contextmanager
def pair_locked(matrix_path: Path, with_recycled_store: bool = True) -> Iterator[None]:
    """Both locks, for one moment's state of the pair: the recycled store's first, as wherever both
    are held, so two holders never wait on each other. `with_recycled_store=False` takes the
    matrix's alone (no lock file is made for a recycled store that is not there)."""
    matrix, recycled = pair_paths(matrix_path)
    with locked(recycled) if with_recycled_store else contextlib.nullcontext(), locked(matrix):
        yield


def check_rebuild(matrix_path: Path, overwrite: bool = False) -> None:
    """A rebuild writes both files of the pair: unless `overwrite`, a FixableError (OVERWRITE)
    names the first of them that exists."""
    if overwrite:
        return
    matrix, recycled = pair_paths(matrix_path)
    if matrix.exists():
        raise FixableError(f"{matrix}: a matrix already exists ({_summary(matrix)})", (Remedy.OVERWRITE,))
    if recycled.exists():
        raise FixableError(f"{recycled}: a recycled store already exists", (Remedy.OVERWRITE,))


def _summary(path: Path) -> str:
    try:
        meta = read_matrix(path).meta
    except MatrixFileError:
        return "unreadable"
    return f"{meta.update_count:,} row updates, last {iso(meta.updated_us)}"


def write_built_matrix(path: Path, matrix: torch.Tensor, owner: MatrixOwner) -> MatrixFile:
    """Write a matrix built from text (under its lock): its filled rows stamped now and counted as
    updates, so later merges weigh them like rows learned while decoding."""
    data = MatrixFile.empty(owner.vocab_size, owner.k, owner.fingerprint, owner.model_id)
    data.matrix = matrix.cpu()
    data.stamps[filled_rows(data.matrix)] = now_us()
    data.meta = replace(data.meta, update_count=data.rows_filled)
    with locked(path):
        write_matrix(path, data)
    return data


def write_corpus_recycled_store(
    matrix_path: Path, token_lists: list[list[int]], owner: MatrixOwner
) -> tuple[Path, RecycledStoreFile]:
    """Write the recycled store beside `matrix_path` (under its lock) holding one document per
    text; where it went, and what it holds (texts too short to teach anything are left out)."""
    store = RecycledStore(owner.vocab_size)
    start = now_us()
    for offset, tokens in enumerate(token_lists):
        store.add(tokens, start + offset)  # distinct stamps: a later merge keeps every text
    data = RecycledStoreFile(RecycledStoreMeta(owner.vocab_size, owner.fingerprint, owner.model_id), store.documents)
    target = recycled_store_path(matrix_path)
    with locked(target):
        write_recycled_store(target, data)
    return target, data
