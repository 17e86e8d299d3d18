"""Where and in which dtype a model runs, and the device in words for reports."""

from __future__ import annotations

import torch

from ..errors import SettingError
from .cpu import cpu_has_native_bf16, cpu_name


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SettingError("device", name, "no CUDA device is available here; use cpu or auto")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SettingError("device", name, "Apple MPS is not available here; use cpu or auto")
    if name not in ("cpu", "cuda", "mps"):
        raise SettingError("device", name, "unknown device; use auto, cpu, cuda or mps")
    return torch.device(name)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16', not 'torch.bfloat16': as the dtype setting takes it and reports show it."""
    return str(dtype).removeprefix("torch.")


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if name not in _DTYPES:
        raise SettingError("dtype", name, "unknown dtype; use auto, float32, bfloat16 or float16")
    return _DTYPES[name]


def device_name(device: torch.device) -> str:
    """The device in words: the CPU or GPU model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return cpu_name()
    return device.type
