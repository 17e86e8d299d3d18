"""The matrix a command decodes with: loaded from the store at start, saved (merged) at exit.

Only rows this process changed are written back, merged under the lock onto whatever the file
holds by then, so two `tr` processes sharing a matrix keep each other's work. The acceptance
statistics learned with the matrix (which size the designed tree) travel beside it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..core.design.acceptance_stats import AcceptanceStats
from ..errors import MatrixFileError
from .acceptance_file import load_acceptance, save_acceptance
from .atomic import locked
from .matrix_file import (
    MatrixFile,
    MatrixMeta,
    check_compatible,
    default_path,
    read_matrix,
    tokenizer_fingerprint,
    write_matrix,
)
from .timestamps import iso, now_us


@dataclass
class HotMatrix:
    path: Path
    matrix: torch.Tensor  # the live matrix on the model's device, updated in place by the decoder
    state: str  # "hot" (loaded from the store), "new" (no file yet), "cold" (--cold: started empty)
    meta: MatrixMeta  # as loaded (or fresh)
    save_enabled: bool
    _saved: torch.Tensor  # CPU copy of the content last loaded or saved
    acceptance: AcceptanceStats  # acceptance by depth and slot, saved beside the file

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
    ) -> HotMatrix:
        fingerprint = tokenizer_fingerprint(tokenizer)
        path = Path(path) if path else default_path(fingerprint, vocab_size, k)
        fresh = MatrixFile.empty(vocab_size, k, fingerprint, model_id)
        data, state = fresh, "cold" if cold else "new"
        if not cold and path.exists():
            try:
                data = read_matrix(path)
            except MatrixFileError as exc:
                raise MatrixFileError(f"{exc}; move it away, pass another --matrix, or use --cold") from None
            check_compatible(data.meta, fingerprint, vocab_size, k, path)
            state = "hot"
        matrix = data.matrix.to(device)
        acceptance = load_acceptance(path, k, device) if not cold else AcceptanceStats(k, device)
        return cls(path, matrix, state, data.meta, save, data.matrix.clone(), acceptance)

    def fork(self) -> HotMatrix:
        """A copy to decode with that is never saved (bench variants learn on their own copies)."""
        return replace(self, matrix=self.matrix.clone(), acceptance=self.acceptance.copy(), save_enabled=False)

    @property
    def start_update_count(self) -> int:
        return self.meta.update_count if self.state == "hot" else 0

    def describe(self) -> str:
        if self.state == "hot":
            return f"hot matrix ({self.meta.update_count:,} row updates, last {iso(self.meta.updated_us)}) {self.path}"
        if self.state == "cold":
            return "cold matrix (--cold: started empty)" + ("" if self.save_enabled else ", not saved")
        return f"new matrix (nothing stored yet) {self.path}"

    def save(self) -> int:
        """Merge this session's changed rows into the file; returns how many rows were written."""
        if not self.save_enabled:
            return 0
        if self.acceptance.observed_steps:
            save_acceptance(self.path, self.acceptance)
        current = self.matrix.detach().to("cpu")
        changed = (current != self._saved).any(dim=1)
        count = int(changed.sum())
        if count == 0:
            return 0
        with locked(self.path):
            base = MatrixFile.empty(self.meta.vocab_size, self.meta.k, self.meta.fingerprint, self.meta.model_id)
            if self.path.exists():
                try:
                    base = read_matrix(self.path)
                except MatrixFileError:
                    # Keep the unreadable file for the user rather than overwrite it silently.
                    shutil.move(self.path, self.path.with_name(self.path.name + f".corrupt-{now_us()}"))
            t = now_us()
            base.matrix[changed] = current[changed]
            base.stamps[changed] = t
            base.meta = replace(
                base.meta, update_count=base.meta.update_count + count, updated_us=t, model_id=self.meta.model_id
            )
            write_matrix(self.path, base)
        self._saved = current.clone()
        return count
