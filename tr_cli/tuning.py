"""Fitting the draft tree to this device: the t(N) calibration cache and the acceptance
statistics kept beside each matrix, and the decoder built from them for a `--tree` choice.

Calibration is measured once per (device, model, dtype, threads) and cached in the data dir;
statistics go with the matrix they were learned with (`<matrix>.accept.json`), so a hot start
also starts with a tree fitted to how well that matrix drafts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .core import PRESETS, TokenRecyclingDecoder, TreeSpec
from .core.acceptance_stats import AcceptanceStats
from .core.cost_model import CostModel
from .core.lookup import DEFAULT_LOOKUP_LENGTH
from .models import device_name
from .paths import data_dir
from .store import atomic_write, now_us

CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class TreeChoice:
    """What --tree asked for: a fixed spec, or None for a tree designed for this device."""

    spec: TreeSpec | None
    lookup_length: int

    @property
    def name(self) -> str:
        base = self.spec.name if self.spec else "auto"
        return f"{base}+lookup{self.lookup_length}" if self.lookup_length else base


def tree_choice(spec: TreeSpec | None, lookup: int | None) -> TreeChoice:
    """--tree auto drafts a lookup chain by default; fixed trees stay as written unless --lookup."""
    if lookup is None:
        lookup = DEFAULT_LOOKUP_LENGTH if spec is None else 0
    if lookup < 0:
        raise ValueError(f"--lookup {lookup}: must be 0 (off) or a chain length")
    return TreeChoice(spec, lookup)


def stats_path(matrix_path: Path) -> Path:
    return Path(matrix_path).with_suffix(".accept.json")


def load_stats(matrix_path: Path, k: int, device: torch.device | str) -> AcceptanceStats:
    """The statistics saved beside the matrix; the prior alone when there are none (or they are
    unreadable: they are rebuilt while decoding, and a bad file is moved aside on the next save)."""
    stats = AcceptanceStats(k, device)
    path = stats_path(matrix_path)
    if path.exists():
        try:
            stats.load_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    return stats


def save_stats(matrix_path: Path, stats: AcceptanceStats) -> Path:
    path = stats_path(matrix_path)
    if path.exists():
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            path.replace(path.with_name(path.name + f".corrupt-{now_us()}"))
    atomic_write(path, (json.dumps(stats.to_dict()) + "\n").encode())
    return path


def calibration_key(model: torch.nn.Module, model_id: str, device: torch.device, dtype: torch.dtype, k: int) -> str:
    """Everything t(N) depends on: device model, threads, torch version, the model's shape, dtype."""
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else str(model.config)
    parts = [
        str(CALIBRATION_VERSION), device.type, device_name(device), str(torch.get_num_threads()), torch.__version__,
        model_id, hashlib.sha256(config.encode()).hexdigest(), str(dtype), str(k),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def calibration_path(key: str) -> Path:
    return data_dir() / "calibration" / f"{key}.json"


def load_or_calibrate(
    decoder: TokenRecyclingDecoder, model_id: str, recalibrate: bool = False, status: Callable[[str], None] | None = None
) -> CostModel:
    """The cached t(N) of this device and model, measured now (a few seconds) when missing."""
    dtype = next(decoder.model.parameters()).dtype
    key = calibration_key(decoder.model, model_id, decoder.device, dtype, decoder.k)
    path = calibration_path(key)
    if path.exists() and not recalibrate:
        try:
            return CostModel.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass  # measured again and rewritten below
    if status:
        status("Measuring step cost t(N) on this device (once per model and device)")
    cost = decoder.measure_cost()
    record = cost.to_dict() | {"device": device_name(decoder.device), "model": model_id, "dtype": str(dtype),
                               "threads": torch.get_num_threads(), "measured_us": now_us()}
    atomic_write(path, (json.dumps(record, indent=1) + "\n").encode())
    return cost


def build_decoder(
    model: torch.nn.Module,
    matrix: torch.Tensor,
    choice: TreeChoice,
    model_id: str,
    stats: AcceptanceStats | None = None,
    status: Callable[[str], None] | None = None,
    **kwargs,
) -> TokenRecyclingDecoder:
    """A decoder for the --tree choice; `auto` calibrates (or reads the cached calibration) first."""
    # `auto` starts from no tree (valid for any k) until the cost model is in hand.
    decoder = TokenRecyclingDecoder(model, matrix=matrix, tree=choice.spec or PRESETS["none"], stats=stats,
                                    lookup_length=choice.lookup_length, **kwargs)
    if choice.spec is None:
        decoder.use_cost_model(load_or_calibrate(decoder, model_id, status=status))
    return decoder
