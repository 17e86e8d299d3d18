"""Where a model runs and how its weights are held, resolved once from what the user asked for.

`Runtime.resolve("auto", "auto", "int4+bf16")` checks the three settings together (a quantized
mode runs on the CPU in bfloat16) before any weights load; `load_model` takes the result as is,
and `LoadedModel.runtime` records it for banners, reports and calibration keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SettingError
from .device import dtype_name, pick_device, pick_dtype

QUANTIZED_DTYPE = torch.bfloat16  # the weight-only kernels' activations (float32 ones are 5-20x slower)
QUANTIZED_KINDS = ("int8", "int4")
PROMPT_SUFFIX = "+bf16"


@dataclass(frozen=True)
class WeightsMode:
    """How the matmul weights are held: dense (in the model's dtype), or quantized (`int8`/`int4`
    weight-only kernels), optionally keeping the bfloat16 weights for prompts (`+bf16`)."""

    quantized: str | None = None  # None: dense
    bf16_prompts: bool = False

    def __post_init__(self) -> None:
        if self.quantized is not None and self.quantized not in QUANTIZED_KINDS:
            raise ValueError(f"unknown quantization {self.quantized!r}")
        if self.bf16_prompts and self.quantized is None:
            raise ValueError("bfloat16 prompt weights come with a quantized mode")

    @classmethod
    def parse(cls, text: str) -> WeightsMode:
        """'dense', 'int8', 'int4', 'int8+bf16' or 'int4+bf16'."""
        if text == "dense":
            return DENSE
        kind = text.removesuffix(PROMPT_SUFFIX)
        if kind not in QUANTIZED_KINDS:
            raise SettingError("weights", text, f"unknown; use {', '.join(WEIGHTS_NAMES)}")
        return cls(kind, text.endswith(PROMPT_SUFFIX))

    @property
    def dense(self) -> bool:
        return self.quantized is None

    @property
    def name(self) -> str:
        if self.quantized is None:
            return "dense"
        return self.quantized + (PROMPT_SUFFIX if self.bf16_prompts else "")

    def __str__(self) -> str:
        return self.name


DENSE = WeightsMode()
WEIGHTS_NAMES = ("dense", *QUANTIZED_KINDS, *(kind + PROMPT_SUFFIX for kind in QUANTIZED_KINDS))
QUANTIZED_MODES = tuple(WeightsMode.parse(name) for name in WEIGHTS_NAMES if name != "dense")


@dataclass(frozen=True)
class Runtime:
    """A model's device, the dtype it is loaded in, and its weights mode: one checked value."""

    device: torch.device
    dtype: torch.dtype
    weights: WeightsMode = DENSE

    @classmethod
    def resolve(cls, device: str = "auto", dtype: str = "auto", weights: str = "dense") -> Runtime:
        """The settings as given (names, 'auto' allowed), checked together; SettingError names the
        first one that cannot run here."""
        mode = WeightsMode.parse(weights)
        torch_device = pick_device(device)
        if mode.dense:
            return cls(torch_device, pick_dtype(dtype, torch_device), mode)
        if torch_device.type != "cpu":
            raise SettingError(
                "weights",
                mode,
                f"runs on torch's CPU kernels; use the cpu device, or dense weights on {torch_device.type}",
            )
        if dtype != "auto" and pick_dtype(dtype, torch_device) != QUANTIZED_DTYPE:
            raise SettingError("weights", mode, "computes in bfloat16; leave the dtype at auto or give bfloat16")
        return cls(torch_device, QUANTIZED_DTYPE, mode)

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    def describe(self) -> str:
        """'bfloat16' or 'int4+bf16 weights, bfloat16'."""
        return self.dtype_name if self.weights.dense else f"{self.weights} weights, {self.dtype_name}"
