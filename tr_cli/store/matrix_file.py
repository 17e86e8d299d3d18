"""Matrix files: the hot-start matrices that outlive the process, one per tokenizer.

One file per tokenizer (fingerprint + vocabulary size + k) in the data dir (`matrices_dir()`), in
safetensors (loading runs no code) with string metadata. Each row carries an update stamp
(microseconds since the epoch) so merges keep the newer candidates per row. Writes go to a temp
file in the same directory, are fsynced and renamed over the target, under a lock file, so a
crash or a concurrent writer never leaves a corrupt or half-merged matrix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import __version__
from ..core.matrix import rows_filled
from ..errors import MatrixFileError, SettingError, StoreError
from .atomic import atomic_write
from .paths import cache_dir, matrices_dir
from .remedies import FixableError, Remedy
from .safetensors_file import StringMetadata, read_safetensors
from .timestamps import now_us

FORMAT_VERSION = 1
# What fixes a matrix (or recycled store) of another model met where this model's should be.
OTHER_MODEL = (Remedy.OWN_MATRIX, Remedy.COLD)
SUFFIX = ".safetensors"
RECYCLED_STORE_SUFFIX = ".store" + SUFFIX  # the recycled store kept beside a matrix (recycled_file.py)
_MATRIX, _STAMPS = "matrix", "row_stamps"


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the token -> id mapping and the special tokens: equal fingerprints mean drafts from
    one model are valid token ids with the same meaning for the other. Remembered per version of the
    files the tokenizer was read from (fingerprints.json in the cache): a 151,936-token vocabulary
    takes 0.4 s of every start to hash on a 2-core EPYC."""
    source = _tokenizer_source(tokenizer)
    try:
        memo_file = cache_dir() / _FINGERPRINTS
    except StoreError:  # TR_HOME unusable: said where state is written, not here
        source = None
    memo = _read_memo(memo_file) if source else {}
    if source in memo:
        return memo[source]
    digest = hashlib.sha256()
    vocab = tokenizer.get_vocab()
    digest.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    specials = {name: str(value) for name, value in sorted(getattr(tokenizer, "special_tokens_map", {}).items())}
    digest.update(json.dumps(specials, sort_keys=True).encode())
    fingerprint = digest.hexdigest()[:16]
    if source:
        memo = {key: value for key, value in memo.items() if key != source}
        memo = dict(list(memo.items())[-(_FINGERPRINTS_KEPT - 1) :]) | {source: fingerprint}
        with contextlib.suppress(OSError, StoreError):  # only a speed-up
            atomic_write(memo_file, json.dumps(memo, indent=0).encode())
    return fingerprint


# The files a tokenizer's vocabulary and special tokens are read from (transformers' names).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
_FINGERPRINTS = "fingerprints.json"
_FINGERPRINTS_KEPT = 64


def _tokenizer_source(tokenizer) -> str | None:
    """What the tokenizer was read from: its class, size and directory, and each tokenizer file there
    by size, modification time and inode; None for one not read from a directory of such files."""
    name = getattr(tokenizer, "name_or_path", None)
    directory = Path(name) if isinstance(name, str) and name else None
    if directory is None or not directory.is_dir():
        return None
    files = []
    for file in _TOKENIZER_FILES:
        try:
            stat = (directory / file).stat()
        except OSError:
            continue
        files.append([file, stat.st_size, stat.st_mtime_ns, stat.st_ino])
    if not files:
        return None
    try:
        size = len(tokenizer)
    except TypeError:
        return None
    return json.dumps([type(tokenizer).__qualname__, size, str(directory.resolve()), files])


def _read_memo(path: Path) -> dict[str, str]:
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(memo, dict):
        return {}
    return {k: v for k, v in memo.items() if isinstance(k, str) and isinstance(v, str)}


def is_matrix_name(path: Path) -> bool:
    """Whether a file in the matrices directory is a matrix (not the recycled store kept beside one)."""
    return path.name.endswith(SUFFIX) and not path.name.endswith(RECYCLED_STORE_SUFFIX)


def matrix_file_paths(directory: Path | None = None) -> list[Path]:
    """The matrix files in `directory` (default: the data dir's matrices), sorted, without reading them."""
    directory = matrices_dir() if directory is None else directory
    return sorted(path for path in directory.glob(f"*{SUFFIX}") if is_matrix_name(path) and path.is_file())


def default_path(fingerprint: str, vocab_size: int, k: int) -> Path:
    return matrices_dir() / f"{fingerprint}-v{vocab_size}-k{k}{SUFFIX}"


@dataclass(frozen=True)
class MatrixOwner:
    """The model a matrix file is for: its tokenizer (fingerprint, vocabulary size), the k
    candidates kept per row, and its id (a label: the file name holds the rest)."""

    fingerprint: str
    vocab_size: int
    k: int
    model_id: str

    @classmethod
    def of(cls, tokenizer, vocab_size: int, k: int, model_id: str) -> MatrixOwner:
        check_width(vocab_size, k)
        return cls(tokenizer_fingerprint(tokenizer), vocab_size, k, model_id)

    @property
    def default_path(self) -> Path:
        return default_path(self.fingerprint, self.vocab_size, self.k)


def check_width(vocab_size: int, k: int) -> None:
    """A row keeps k distinct candidates, the top k of the model's logits: a vocabulary of fewer
    tokens cannot fill it (torch.topk refused deep in the first forward)."""
    if k > vocab_size:
        raise SettingError(
            "k",
            k,
            f"more candidates per matrix row than the model has tokens ({vocab_size}); pass --k {vocab_size} or less",
        )


@dataclass(frozen=True)
class MatrixMeta(StringMetadata):
    vocab_size: int
    k: int
    fingerprint: str
    model_id: str
    update_count: int = 0
    created_us: int = 0
    updated_us: int = 0
    format_version: int = FORMAT_VERSION
    tr_version: str = __version__


@dataclass
class MatrixFile:
    matrix: torch.Tensor  # (V, k) int32, CPU
    stamps: torch.Tensor  # (V,) int64, CPU: when each row last changed (0 = never)
    meta: MatrixMeta

    @classmethod
    def empty(cls, vocab_size: int, k: int, fingerprint: str, model_id: str) -> MatrixFile:
        t = now_us()
        meta = MatrixMeta(vocab_size, k, fingerprint, model_id, created_us=t, updated_us=t)
        return cls(torch.zeros(vocab_size, k, dtype=torch.int32), torch.zeros(vocab_size, dtype=torch.int64), meta)

    @property
    def rows_filled(self) -> int:
        return rows_filled(self.matrix)

    def merged_with(self, other: MatrixFile) -> MatrixFile:
        """Per row, the candidates with the newer stamp (ties keep self's)."""
        newer = other.stamps > self.stamps
        matrix = torch.where(newer[:, None], other.matrix, self.matrix)
        stamps = torch.maximum(self.stamps, other.stamps)
        meta = replace(self.meta, update_count=self.meta.update_count + int(newer.sum()), updated_us=now_us())
        return MatrixFile(matrix, stamps, meta)


def read_matrix(path: Path) -> MatrixFile:
    """Load and validate a matrix file; MatrixFileError (one line) for anything unusable."""
    meta, tensors = read_safetensors(path, (_MATRIX, _STAMPS), MatrixMeta.from_strings, "matrix", MatrixFileError)
    matrix, stamps = tensors[_MATRIX], tensors[_STAMPS]
    if meta.format_version > FORMAT_VERSION:
        raise MatrixFileError(
            f"{path}: matrix format {meta.format_version} is newer than this tr understands; upgrade tr"
        )
    if matrix.dtype != torch.int32 or tuple(matrix.shape) != (meta.vocab_size, meta.k):
        raise MatrixFileError(
            f"{path}: matrix tensor is {matrix.dtype} {tuple(matrix.shape)}, "
            f"metadata says int32 ({meta.vocab_size}, {meta.k})"
        )
    if stamps.dtype != torch.int64 or tuple(stamps.shape) != (meta.vocab_size,):
        raise MatrixFileError(f"{path}: row stamps do not match the matrix")
    if matrix.numel() and (int(matrix.min()) < 0 or int(matrix.max()) >= meta.vocab_size):
        raise MatrixFileError(f"{path}: matrix holds token ids outside the vocabulary (corrupt file)")
    return MatrixFile(matrix, stamps, meta)


def write_matrix(path: Path, data: MatrixFile) -> None:
    """Serialize and write atomically."""
    from safetensors.torch import save

    payload = save(
        {_MATRIX: data.matrix.contiguous(), _STAMPS: data.stamps.contiguous()}, metadata=data.meta.to_strings()
    )
    atomic_write(Path(path), payload)


def copy_matrix_file(source: Path, target: Path) -> MatrixFile:
    """Validate `source`, then write its exact bytes to `target` atomically."""
    data = read_matrix(source)
    atomic_write(Path(target), Path(source).read_bytes())
    return data


def list_matrices() -> list[tuple[Path, MatrixFile | None]]:
    """Every matrix file in the data dir, newest first; unreadable files are listed with None."""
    out: list[tuple[Path, MatrixFile | None]] = []
    for path in matrix_file_paths():
        try:
            out.append((path, read_matrix(path)))
        except MatrixFileError:
            out.append((path, None))
    return sorted(out, key=lambda item: -(item[1].meta.updated_us if item[1] else 0))


def check_compatible(
    meta: MatrixMeta,
    fingerprint: str,
    vocab_size: int,
    k: int,
    path: Path,
    remedies: tuple[Remedy, ...] = OTHER_MODEL,
) -> None:
    """A matrix file may serve a model only with its shape and its tokenizer's token ids; a
    FixableError (with `remedies`) otherwise."""
    if meta.vocab_size != vocab_size or meta.k != k:
        raise FixableError(
            f"{path}: matrix is {meta.vocab_size}x{meta.k} but this model needs {vocab_size}x{k}", remedies
        )
    check_fingerprint("matrix", meta.fingerprint, meta.model_id, fingerprint, path, remedies)


def check_fingerprint(
    what: str, found: str, model_id: str, fingerprint: str, path: Path, remedies: tuple[Remedy, ...] = OTHER_MODEL
) -> None:
    """Stored token ids (a matrix's, a recycled store's) mean the same tokens only under the same tokenizer."""
    if found != fingerprint:
        raise FixableError(
            f"{path}: {what} belongs to another tokenizer (fingerprint {found}, model {model_id}); "
            "its token ids mean other tokens here",
            remedies,
        )
