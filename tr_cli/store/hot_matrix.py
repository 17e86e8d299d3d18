"""The matrix a command decodes with: loaded from its matrix file at start, saved (merged) at exit.

Only rows this process changed are written back, merged under the lock onto whatever the file
holds by then, so two `tr` processes sharing a matrix keep each other's work. The acceptance
statistics learned with the matrix (which size the designed tree) and the recycled store (the
token streams of earlier conversations) travel beside it, each in its own file, each merged and
saved on its own: one that cannot be written does not cost the others.

A new user (no stored matrix at the model's default path) starts from the starter files shipped
with tr when there are some for the tokenizer (tr_cli/seed/); what they learn is saved to their
own files at the default path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..core.design.acceptance_stats import AcceptanceStats
from ..core.recycled_store import RecycledStore
from ..core.wording import counted
from ..errors import MatrixFileError, StoreError, StoreFileError, first_line
from .acceptance_file import acceptance_path, load_acceptance, save_acceptance
from .atomic import kept_aside, locked, move_aside
from .matrix_file import (
    OTHER_MODEL,
    MatrixFile,
    MatrixMeta,
    check_compatible,
    check_width,
    default_path,
    read_matrix,
    tokenizer_fingerprint,
    write_matrix,
)
from .paths import seed_dir
from .recycled_file import (
    check_recycled_store_compatible,
    read_recycled_store,
    recycled_store_path,
    save_recycled_store,
)
from .remedies import FixableError, FixableMatrixFileError, FixableRecycledStoreError, Remedy
from .timestamps import iso, now_us

# What fixes an unreadable file a run would read.
UNREADABLE = (Remedy.MOVE_AWAY, Remedy.OTHER_MATRIX, Remedy.COLD)
# A cold start does not read its files but saves into them at exit: what is there must be ours to
# merge into.
SAVE_TARGET = (Remedy.MOVE_AWAY, Remedy.OTHER_MATRIX, Remedy.NO_SAVE)
STARTER = (Remedy.REINSTALL, Remedy.COLD)
_STARTER_DAMAGED = "the starter files shipped with tr are damaged"


@dataclass(frozen=True)
class Saved:
    """What one save wrote."""

    rows: int = 0  # matrix rows
    documents: int = 0  # conversations added to the recycled store
    tokens: int = 0  # their tokens
    kept_aside: tuple[Path, ...] = ()  # unreadable files met while saving, renamed rather than overwritten


@dataclass
class HotMatrix:
    path: Path
    matrix: torch.Tensor  # the live matrix on the model's device, updated in place by the decoder
    # "hot" (loaded from its matrix file), "new" (no file yet), "cold" (--cold: started empty),
    # "seeded" (no file yet: started from the starter matrix shipped with tr)
    state: str
    meta: MatrixMeta  # as loaded (or fresh)
    save_enabled: bool
    _saved: torch.Tensor  # CPU copy of the content last loaded or saved
    acceptance: AcceptanceStats  # acceptance by depth and slot, saved beside the file
    store: RecycledStore  # the recycled store: earlier conversations, saved beside the file
    seed: Path | None = None  # the starter matrix this one started from ("seeded")
    warnings: list[str] = field(default_factory=list)  # for the user, once, before decoding
    _saved_acceptance: AcceptanceStats | None = None  # the statistics as loaded or last saved
    waiting: Callable[[str], None] | None = None  # told when a save waits for another process's lock

    @classmethod
    def open(
        cls,
        tokenizer,
        vocab_size: int,
        model_id: str,
        k: int = 8,
        device: torch.device | str = "cpu",
        path: Path | None = None,
        cold: bool = False,
        save: bool = True,
        seeds: Path | None = None,
    ) -> HotMatrix:
        """The stored matrix (and its recycled store and statistics) at `path` or the model's
        default path; at the default path with no file yet, the starter files in `seeds` (default:
        those shipped with tr) when there are some; with `cold`, empty ones. A file it cannot use
        is a FixableError (remedies.py) left as it is."""
        check_width(vocab_size, k)
        fingerprint = tokenizer_fingerprint(tokenizer)
        explicit = path is not None
        path = Path(path) if explicit else default_path(fingerprint, vocab_size, k)
        data, state, seed = MatrixFile.empty(vocab_size, k, fingerprint, model_id), "cold" if cold else "new", None
        if cold and save:
            _check_save_target(path, fingerprint, vocab_size, k)
        if not cold and path.exists():
            data, state = _open_matrix(path, fingerprint, vocab_size, k, UNREADABLE), "hot"
        elif not cold and not explicit:
            candidate = starter_matrix(path, seeds)
            if candidate is not None:
                with _noted(_STARTER_DAMAGED):
                    data = _open_matrix(candidate, fingerprint, vocab_size, k, STARTER, STARTER)
                state, seed = "seeded", candidate
                # The user's file names the user's model (the starter may come from another one).
                data.meta = replace(data.meta, model_id=model_id)
        loaded = None if cold else _open_recycled_store(path, seed, fingerprint, vocab_size)
        store = loaded if loaded is not None else RecycledStore(vocab_size)
        warnings: list[str] = []
        if cold:
            acceptance = AcceptanceStats(k, device)
        else:
            own = seed is None or acceptance_path(path).exists()
            acceptance, problem = load_acceptance(path if own else seed, k, device)
            if problem:
                warnings.append(f"{problem}; the prior is used, and the file is moved aside at the next save")
        matrix = data.matrix.to(device)
        hot = cls(path, matrix, state, data.meta, save, data.matrix.clone(), acceptance, store, seed, warnings)
        hot._saved_acceptance = acceptance.copy()
        return hot

    def fork(self) -> HotMatrix:
        """A copy to decode with that is never saved (bench variants learn on their own copies)."""
        return replace(
            self,
            matrix=self.matrix.clone(),
            acceptance=self.acceptance.copy(),
            store=self.store.copy(),
            save_enabled=False,
        )

    @property
    def start_update_count(self) -> int:
        return self.meta.update_count if self.state in ("hot", "seeded") else 0

    def describe(self) -> str:
        if self.state == "hot":
            text = f"hot matrix ({self.meta.update_count:,} row updates, last {iso(self.meta.updated_us)}) {self.path}"
        elif self.state == "seeded":
            # Nothing is written yet: the save at exit may still fail (a full disk), so no "saved".
            where = f"; what this run learns is saved to {self.path}" if self.save_enabled else ", not saved"
            text = f"starter matrix shipped with tr ({self.meta.update_count:,} row updates){where}"
        elif self.state == "cold":
            text = "cold matrix (--cold: started empty)" + ("" if self.save_enabled else ", not saved")
        else:
            text = f"new matrix (nothing stored yet) {self.path}"
        count = len(self.store.documents)
        if count:
            text += f" + store of {self.store.total_tokens:,} tokens in {counted(count, 'conversation')}"
        return text

    def save(self) -> Saved:
        """Merge this session's changed rows into the matrix file, its new conversations into the
        recycled store and its statistics beside them. Each part is tried whatever happened to the
        others; a StoreError after all of them names those that failed."""
        if not self.save_enabled:
            return Saved()
        failures: list[str] = []
        rows = documents = tokens = 0
        aside = kept_aside(self.path)
        if self.acceptance.observed_steps:
            try:
                save_acceptance(self.path, self.acceptance, self._saved_acceptance, self.waiting)
                self._saved_acceptance = self.acceptance.copy()
            except Exception as exc:  # noqa: BLE001 - one part failing must not cost the others
                failures.append(f"acceptance statistics to {acceptance_path(self.path)} ({first_line(exc)})")
        try:
            rows = self._save_matrix()
        except Exception as exc:  # noqa: BLE001 - one part failing must not cost the others
            failures.append(f"matrix to {self.path} ({first_line(exc)})")
        if self.store.added:
            target = recycled_store_path(self.path)
            fallback = recycled_store_path(self.seed) if self.seed else None
            pending = list(self.store.added)
            try:
                save_recycled_store(
                    target, self.store, self.meta.fingerprint, self.meta.model_id, fallback, self.waiting
                )
                documents, tokens = len(pending), sum(doc.tokens.numel() for doc in pending)
            except Exception as exc:  # noqa: BLE001 - one part failing must not cost the others
                failures.append(f"recycled store to {target} ({first_line(exc)})")
        if failures:
            raise StoreError(f"could not save the {'; the '.join(failures)}")
        return Saved(rows, documents, tokens, tuple(sorted(kept_aside(self.path) - aside)))

    def _save_matrix(self) -> int:
        """Rows changed since the last load or save, merged onto the file; how many."""
        current = self.matrix.detach().to("cpu")
        changed = (current != self._saved).any(dim=1)
        count = int(changed.sum())
        if count == 0:
            return 0
        with locked(self.path, waiting=self.waiting):
            base = MatrixFile.empty(self.meta.vocab_size, self.meta.k, self.meta.fingerprint, self.meta.model_id)
            if self.path.exists():
                try:
                    base = read_matrix(self.path)
                except MatrixFileError:
                    move_aside(self.path)  # kept for the user rather than overwritten silently
            elif self.seed is not None:
                base = read_matrix(self.seed)  # the user's first file: the starter plus what changed
            t = now_us()
            base.matrix[changed] = current[changed]
            base.stamps[changed] = t
            base.meta = replace(
                base.meta, update_count=base.meta.update_count + count, updated_us=t, model_id=self.meta.model_id
            )
            write_matrix(self.path, base)
        self._saved = current.clone()
        return count


@contextlib.contextmanager
def _noted(note: str) -> Iterator[None]:
    """FixableErrors raised inside say `note` (why the file matters) after what is wrong."""
    try:
        yield
    except FixableError as exc:
        raise type(exc)(f"{exc.problem}; {note}", exc.remedies) from None


def _open_matrix(
    path: Path,
    fingerprint: str,
    vocab_size: int,
    k: int,
    unreadable: tuple[Remedy, ...],
    other_model: tuple[Remedy, ...] = OTHER_MODEL,
) -> MatrixFile:
    """The matrix at `path` for this model; `unreadable` fixes an unreadable file, `other_model`
    a file of another model."""
    try:
        data = read_matrix(path)
    except MatrixFileError as exc:
        raise FixableMatrixFileError(str(exc), unreadable) from None
    check_compatible(data.meta, fingerprint, vocab_size, k, path, other_model)
    return data


def _check_save_target(path: Path, fingerprint: str, vocab_size: int, k: int) -> None:
    """Files a cold start would merge into at exit must be this model's matrix and recycled
    store: a user's other file (or another model's matrix) is refused now, not written over later."""
    with _noted("a cold start saves into it at exit"):
        if path.exists():
            _open_matrix(path, fingerprint, vocab_size, k, SAVE_TARGET, SAVE_TARGET)
        _open_recycled_store(path, None, fingerprint, vocab_size, SAVE_TARGET, SAVE_TARGET)


def starter_matrix(path: Path, seeds: Path | None = None) -> Path | None:
    """The starter matrix a run whose matrix belongs at the default `path` (and has no file there
    yet) starts from: the one shipped with tr (or in `seeds`) for its tokenizer and k, if any."""
    candidate = (seed_dir() if seeds is None else Path(seeds)) / path.name
    return candidate if candidate.is_file() else None


def _open_recycled_store(
    path: Path,
    seed: Path | None,
    fingerprint: str,
    vocab_size: int,
    unreadable: tuple[Remedy, ...] = UNREADABLE,
    other_model: tuple[Remedy, ...] = OTHER_MODEL,
) -> RecycledStore | None:
    """The recycled store beside the matrix at `path`, else the one beside the starter matrix
    `seed`; None: neither."""
    own = recycled_store_path(path)
    if own.exists():
        return _read_recycled_store(own, fingerprint, vocab_size, unreadable, other_model)
    if seed is not None and recycled_store_path(seed).exists():
        with _noted(_STARTER_DAMAGED):
            return _read_recycled_store(recycled_store_path(seed), fingerprint, vocab_size, STARTER, STARTER)
    return None


def _read_recycled_store(
    path: Path,
    fingerprint: str,
    vocab_size: int,
    unreadable: tuple[Remedy, ...],
    other_model: tuple[Remedy, ...],
) -> RecycledStore:
    try:
        data = read_recycled_store(path)
    except StoreFileError as exc:
        raise FixableRecycledStoreError(str(exc), unreadable) from None
    check_recycled_store_compatible(data.meta, fingerprint, vocab_size, path, other_model)
    return data.to_store()
