"""Matrix files: the hot-start matrices that outlive the process, one per tokenizer.

One file per tokenizer (fingerprint + vocabulary size + k) under `data_dir()/matrices/`, in
safetensors (loading runs no code) with string metadata. Each row carries an update stamp
(microseconds since the epoch) so merges keep the newer candidates per row. Writes go to a temp
file in the same directory, are fsynced and renamed over the target, under a lock file, so a
crash or a concurrent writer never leaves a corrupt or half-merged matrix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from .. import __version__
from ..core.matrix import rows_filled
from ..errors import MatrixFileError, StoreError, first_line
from .atomic import atomic_write
from .paths import data_dir
from .timestamps import now_us

FORMAT_VERSION = 1
OTHER_MODEL_ADVICE = "use the model's own matrix or --cold"
SUFFIX = ".safetensors"
STORE_SUFFIX = ".store" + SUFFIX  # the recycled store kept beside a matrix (recycled_file.py)
_MATRIX, _STAMPS = "matrix", "row_stamps"


def matrices_dir() -> Path:
    return data_dir() / "matrices"


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the token -> id mapping and the special tokens: equal fingerprints mean drafts from
    one model are valid token ids with the same meaning for the other."""
    digest = hashlib.sha256()
    vocab = tokenizer.get_vocab()
    digest.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    specials = {name: str(value) for name, value in sorted(getattr(tokenizer, "special_tokens_map", {}).items())}
    digest.update(json.dumps(specials, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def is_matrix_name(path: Path) -> bool:
    """Whether a file in the matrices directory is a matrix (not the store kept beside one)."""
    return path.name.endswith(SUFFIX) and not path.name.endswith(STORE_SUFFIX)


def default_path(fingerprint: str, vocab_size: int, k: int) -> Path:
    return matrices_dir() / f"{fingerprint}-v{vocab_size}-k{k}{SUFFIX}"


@dataclass(frozen=True)
class MatrixMeta:
    vocab_size: int
    k: int
    fingerprint: str
    model_id: str
    update_count: int = 0
    created_us: int = 0
    updated_us: int = 0
    format_version: int = FORMAT_VERSION
    tr_version: str = __version__

    def to_strings(self) -> dict[str, str]:
        return {key: str(value) for key, value in asdict(self).items()}

    @classmethod
    def from_strings(cls, values: dict[str, str]) -> MatrixMeta:
        ints = ("vocab_size", "k", "update_count", "created_us", "updated_us", "format_version")
        missing = [name for name in (*ints, "fingerprint", "model_id") if name not in values]
        if missing:
            raise ValueError(f"metadata lacks {', '.join(missing)}")
        fields = {name: int(values[name]) for name in ints}
        return cls(
            fingerprint=values["fingerprint"],
            model_id=values["model_id"],
            tr_version=values.get("tr_version", "?"),
            **fields,
        )


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
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise MatrixFileError(f"{path}: no such matrix file")
    if path.stat().st_size == 0:
        raise MatrixFileError(f"{path}: empty file, not a tr matrix")
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != {_MATRIX, _STAMPS}:
                raise ValueError(f"expected tensors {_MATRIX} and {_STAMPS}, found {', '.join(sorted(keys)) or 'none'}")
            meta = MatrixMeta.from_strings(f.metadata() or {})
            matrix = f.get_tensor(_MATRIX)
            stamps = f.get_tensor(_STAMPS)
    except (SafetensorError, ValueError, OSError, RuntimeError) as exc:
        raise MatrixFileError(f"{path}: not a valid tr matrix file ({first_line(exc)})") from None
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
    """Every stored matrix, newest first; unreadable files are listed with None."""
    out: list[tuple[Path, MatrixFile | None]] = []
    for path in sorted(p for p in matrices_dir().glob(f"*{SUFFIX}") if is_matrix_name(p)):
        try:
            out.append((path, read_matrix(path)))
        except MatrixFileError:
            out.append((path, None))
    return sorted(out, key=lambda item: -(item[1].meta.updated_us if item[1] else 0))


def check_compatible(
    meta: MatrixMeta, fingerprint: str, vocab_size: int, k: int, path: Path, advice: str = OTHER_MODEL_ADVICE
) -> None:
    """A matrix file may serve a model only with its shape and its tokenizer's token ids."""
    if meta.vocab_size != vocab_size or meta.k != k:
        raise StoreError(
            f"{path}: matrix is {meta.vocab_size}x{meta.k} but this model needs {vocab_size}x{k}; {advice}"
        )
    check_fingerprint("matrix", meta.fingerprint, meta.model_id, fingerprint, path, advice)


def check_fingerprint(
    what: str, found: str, model_id: str, fingerprint: str, path: Path, advice: str = OTHER_MODEL_ADVICE
) -> None:
    """Stored token ids (a matrix's, a store's) mean the same tokens only under the same tokenizer."""
    if found != fingerprint:
        raise StoreError(
            f"{path}: {what} belongs to another tokenizer (fingerprint {found}, model {model_id}); "
            f"its token ids mean other tokens here; {advice}"
        )
