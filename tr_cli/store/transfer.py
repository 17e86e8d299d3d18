"""Moving a matrix file, with the recycled store beside it, out of the data dir (export: an exact
copy) and into it (import: merged into the stored pair, or replacing it).

Everything is checked before anything is written, so a refused transfer leaves every file as it
was; each file is written atomically under its lock. Errors name no command line: a remedy that
needs one (overwrite, replace, import anyway) is a Remedy the caller words.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ..errors import MatrixFileError, StoreError, StoreFileError, UserError
from .atomic import locked
from .matrix_file import (
    RECYCLED_STORE_SUFFIX,
    SUFFIX,
    MatrixFile,
    MatrixOwner,
    copy_matrix_file,
    read_matrix,
    write_matrix,
)
from .matrix_pair import pair_locked, pair_paths
from .recycled_file import (
    RecycledStoreFile,
    copy_recycled_store_file,
    merge_documents,
    read_recycled_store,
    with_fingerprint,
    write_recycled_store,
)
from .remedies import FixableError, FixableMatrixFileError, FixableRecycledStoreError, Remedy

How = Literal["stored", "replaced", "merged"]  # what an import did to the stored file


@dataclass(frozen=True)
class Exported:
    matrix: MatrixFile
    recycled_store_path: Path  # beside the output
    recycled_store: RecycledStoreFile | None  # None: the stored matrix had none, and none is left there


def check_export_target(output: Path, overwrite: bool = False) -> None:
    """Refuse an export target before anything is read: it and the recycled store beside it must
    be new (unless `overwrite`: FixableError, OVERWRITE), named as a matrix file, in a directory."""
    for target in pair_paths(output):
        if target.exists() and not overwrite:
            raise FixableError(f"{target}: exists", (Remedy.OVERWRITE,))
    if output.suffix != SUFFIX or output.name.endswith(RECYCLED_STORE_SUFFIX):
        raise UserError(f"{output}: matrix files end in {SUFFIX}; name it e.g. {output.with_suffix(SUFFIX).name}")
    if not output.parent.is_dir():
        raise UserError(f"{output}: {output.parent} is not a directory; export to an existing directory")


def export_pair(matrix_path: Path, output: Path) -> Exported:
    """Copy a stored matrix file to `output`, and its recycled store (when there is one) beside
    it: exact bytes, one moment's state of the pair (both locks held), both checked before either
    is written. Without a recycled store, one already beside `output` is removed: it would be
    imported with this matrix. A target that cannot be written is a StoreError naming `output`;
    nothing half written stays (atomic writes)."""
    source_store = pair_paths(matrix_path)[1]
    output_store = pair_paths(output)[1]
    has_store = source_store.exists()
    try:
        with pair_locked(matrix_path, with_recycled_store=has_store):
            if has_store:
                try:
                    read_recycled_store(source_store)
                except StoreFileError as exc:
                    problem = f"{exc}; the stored recycled store is damaged"
                    raise FixableRecycledStoreError(problem, (Remedy.EXPORT_ALONE,)) from None
            try:
                matrix = copy_matrix_file(matrix_path, output)
            except MatrixFileError as exc:
                raise FixableMatrixFileError(f"{exc}; the stored matrix is damaged", (Remedy.REBUILD,)) from None
            recycled = copy_recycled_store_file(source_store, output_store) if has_store else None
        if recycled is None:
            output_store.unlink(missing_ok=True)
    except OSError as exc:  # a read-only or full file system
        raise StoreError(f"{output}: cannot write it ({exc.strerror or exc}); export to a writable directory") from None
    return Exported(matrix, output_store, recycled)


def read_import(source: Path) -> MatrixFile:
    """The matrix file to import, read before anything else is looked at."""
    try:
        return read_matrix(source)
    except MatrixFileError as exc:
        raise MatrixFileError(f"{exc}; the stored matrix was left untouched") from None


@dataclass(frozen=True)
class PlannedImport:
    """An import checked in full, nothing written yet: the matrix and the recycled store beside
    it (None: there is none), labelled as the owner's; `write_matrix`, then `write_recycled_store`."""

    source: Path
    matrix: MatrixFile
    recycled_store: RecycledStoreFile | None
    target: Path  # the owner's stored matrix file
    replace_stored: bool  # replace the stored files rather than merge into them

    @property
    def recycled_store_source(self) -> Path:
        return pair_paths(self.source)[1]

    @property
    def recycled_store_target(self) -> Path:
        return pair_paths(self.target)[1]

    def write_matrix(self) -> tuple[How, MatrixFile]:
        """Store the matrix, merged per row (the newer stamp wins) or replacing; what was written."""
        with locked(self.target):
            if not self.target.exists():
                how, result = "stored", self.matrix
            elif self.replace_stored:
                how, result = "replaced", self.matrix
            else:
                how, result = "merged", _read_stored_matrix(self.target).merged_with(self.matrix)
            write_matrix(self.target, result)
        return how, result

    def write_recycled_store(self) -> tuple[How, RecycledStoreFile] | None:
        """Store the recycled store (None: the import has none): its conversations added to the
        stored ones (those held already are not doubled), or replacing them; what was written."""
        if self.recycled_store is None:
            return None
        target = self.recycled_store_target
        with locked(target):
            if not target.exists():
                how, result = "stored", self.recycled_store
            elif self.replace_stored:
                how, result = "replaced", self.recycled_store
            else:
                current = _read_stored_recycled_store(target)
                incoming = self.recycled_store
                documents = merge_documents(
                    current.documents, incoming.documents, incoming.meta.vocab_size, current.meta.capacity
                )
                how, result = "merged", RecycledStoreFile(current.meta, documents)
            write_recycled_store(target, result)
        return how, result


def plan_import(
    source: Path, incoming: MatrixFile, owner: MatrixOwner, replace_stored: bool = False, any_tokenizer: bool = False
) -> PlannedImport:
    """Check an import of `incoming` (read from `source`) into the owner's stored pair. Refused,
    with every file left as it was: another shape (MATRIX_K when only k differs), another
    tokenizer (ANY_TOKENIZER, unless `any_tokenizer`: then its ids are taken as the owner's), an
    unusable recycled store beside `source`, or (merging) an unreadable stored one (REPLACE)."""
    meta = incoming.meta
    if meta.vocab_size != owner.vocab_size or meta.k != owner.k:
        raise FixableError(
            f"{source}: matrix is {meta.vocab_size:,}×{meta.k}, {owner.model_id} needs "
            f"{owner.vocab_size:,}×{owner.k}; not imported",
            (Remedy.MATRIX_K,) if meta.vocab_size == owner.vocab_size else (),
        )
    if meta.fingerprint != owner.fingerprint and not any_tokenizer:
        raise FixableError(
            f"{source}: written for another tokenizer (fingerprint {meta.fingerprint}, model {meta.model_id}; "
            f"{owner.model_id} has {owner.fingerprint}), so its ids may mean other tokens",
            (Remedy.ANY_TOKENIZER,),
        )
    matrix = MatrixFile(incoming.matrix, incoming.stamps, replace(meta, fingerprint=owner.fingerprint))
    recycled = _incoming_recycled_store(pair_paths(source)[1], owner, any_tokenizer)
    target = owner.default_path
    stored_store = pair_paths(target)[1]
    if recycled is not None and not replace_stored and stored_store.exists():
        _read_stored_recycled_store(stored_store)  # refused now: the matrix is not written either
    return PlannedImport(Path(source), matrix, recycled, target, replace_stored)


def _incoming_recycled_store(path: Path, owner: MatrixOwner, any_tokenizer: bool) -> RecycledStoreFile | None:
    """The recycled store beside an imported matrix file, checked and labelled as the owner's."""
    if not path.exists():
        return None
    try:
        data = read_recycled_store(path)
    except StoreFileError as exc:
        raise StoreFileError(f"{exc}; nothing was imported") from None
    meta = data.meta
    if meta.vocab_size != owner.vocab_size:
        raise StoreError(
            f"{path}: recycled store is for a vocabulary of {meta.vocab_size:,}, {owner.model_id} has "
            f"{owner.vocab_size:,}; nothing was imported"
        )
    if meta.fingerprint == owner.fingerprint:
        return data
    if not any_tokenizer:
        raise FixableError(
            f"{path}: written for another tokenizer (fingerprint {meta.fingerprint}, model {meta.model_id}), "
            "so its ids may mean other tokens",
            (Remedy.ANY_TOKENIZER,),
        )
    return with_fingerprint(data, owner.fingerprint)


def _read_stored_matrix(path: Path) -> MatrixFile:
    try:
        return read_matrix(path)
    except MatrixFileError as exc:
        raise FixableMatrixFileError(f"{exc}; the stored matrix is damaged", (Remedy.REPLACE,)) from None


def _read_stored_recycled_store(path: Path) -> RecycledStoreFile:
    try:
        return read_recycled_store(path)
    except StoreFileError as exc:
        problem = f"{exc}; the stored recycled store is damaged"
        raise FixableRecycledStoreError(problem, (Remedy.REPLACE,)) from None
