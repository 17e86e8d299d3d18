"""t(N) of this device and model, measured once and then read from the store's calibration cache."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

from ..core import TokenRecyclingDecoder
from ..core.design.cost_model import CostModel
from ..models import device_name
from ..store.calibration import read_calibration, write_calibration

CALIBRATION_VERSION = 1


def calibration_key(model: torch.nn.Module, model_id: str, device: torch.device, dtype: torch.dtype, k: int) -> str:
    """Everything t(N) depends on: device model, threads, torch version, the model's shape, dtype."""
    config = (
        model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else str(model.config)
    )
    parts = [
        str(CALIBRATION_VERSION),
        device.type,
        device_name(device),
        str(torch.get_num_threads()),
        torch.__version__,
        model_id,
        hashlib.sha256(config.encode()).hexdigest(),
        str(dtype),
        str(k),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def load_or_calibrate(
    decoder: TokenRecyclingDecoder,
    model_id: str,
    status: Callable[[str], None] | None = None,
) -> CostModel:
    """The cached t(N) of this device and model, measured now (a few seconds) when missing."""
    dtype = next(decoder.model.parameters()).dtype
    key = calibration_key(decoder.model, model_id, decoder.device, dtype, decoder.k)
    cost = read_calibration(key)
    if cost is not None:
        return cost
    if status:
        status("Measuring step cost t(N) on this device (once per model and device)")
    cost = decoder.measure_cost()
    write_calibration(
        key,
        cost,
        {
            "device": device_name(decoder.device),
            "model": model_id,
            "dtype": str(dtype),
            "threads": torch.get_num_threads(),
        },
    )
    return cost
