"""The t(N) calibration cache: one JSON file per key (device, threads, versions, model shape, dtype,
k), so a device is measured once per model shape and dtype."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.design.cost_model import CostModel
from ..errors import StoreError, first_line
from .atomic import atomic_write
from .paths import data_dir
from .timestamps import now_us


def calibration_path(key: str) -> Path:
    return data_dir() / "calibration" / f"{key}.json"


def read_calibration(key: str) -> CostModel | None:
    """The cached cost model, or None when there is none. A file that cannot be read or is not a
    cost model is a StoreError naming it (the caller measures again and overwrites it)."""
    path = calibration_path(key)
    try:
        return CostModel.from_dict(json.loads(path.read_text()))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise StoreError(f"{path}: not a usable t(N) calibration ({first_line(exc)})") from None


def write_calibration(key: str, cost: CostModel, details: dict) -> Path:
    """Store a measurement with what it was measured on (`details`: device, model, dtype, ...). A
    data dir that cannot be written is a StoreError naming the file: the measurement is still good
    for this run, so callers report it rather than fail."""
    path = calibration_path(key)
    record = cost.to_dict() | details | {"measured_us": now_us()}
    try:
        atomic_write(path, (json.dumps(record, indent=1) + "\n").encode())
    except OSError as exc:
        reason = exc.strerror or first_line(exc)
        message = f"could not save the t(N) calibration to {path} ({reason}); it is measured again next run"
        raise StoreError(message) from None
    return path
