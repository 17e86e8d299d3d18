"""The t(N) calibration cache: one JSON file per key (device, threads, torch, model, dtype, k), so
a device is measured once per model and dtype."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.design.cost_model import CostModel
from .atomic import atomic_write
from .paths import data_dir
from .timestamps import now_us


def calibration_path(key: str) -> Path:
    return data_dir() / "calibration" / f"{key}.json"


def read_calibration(key: str) -> CostModel | None:
    """The cached cost model, or None when there is none (or it cannot be read: measured again)."""
    path = calibration_path(key)
    if not path.exists():
        return None
    try:
        return CostModel.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def write_calibration(key: str, cost: CostModel, details: dict) -> Path:
    """Store a measurement with what it was measured on (`details`: device, model, dtype, ...)."""
    path = calibration_path(key)
    record = cost.to_dict() | details | {"measured_us": now_us()}
    atomic_write(path, (json.dumps(record, indent=1) + "\n").encode())
    return path
