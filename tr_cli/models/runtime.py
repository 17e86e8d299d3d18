"""Where a model runs and how its weights are held, resolved once from what the user asked for.

`Runtime.resolve("auto", "auto", "int4+bf16")` checks the three settings together (a quantized
mode runs on the CPU in bfloat16) before any weights load; `load_model` takes the result as is,
and `LoadedModel.runtime` records it for banners, reports and calibration keys.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import SettingError
from .cpu import cpu_has_native_bf16
from .device import dtype_name, pick_device, pick_dtype
from .weights_mode import AUTO, DENSE, WEIGHTS_NAMES, WeightsMode

QUANTIZED_DTYPE = torch.bfloat16  # torch's weight-only kernels' activations (float32 ones are 5-20x slower)
NATIVE_DTYPE = torch.float32  # tr's kernels' activations (models/native_kernels.py)
# GGUF matmul types by the kernel that holds them closest: 4 bits or fewer -> int4 (groups of 32
# with a scale and a minimum, as Q4_1); 5 to 8 bits -> int8 (int4 would lose what the file kept).
_INT4_STORED = ("Q4", "IQ4", "Q3", "IQ3", "Q2", "IQ2", "IQ1", "Q1", "TQ", "MXFP4", "NVFP4")
_INT8_STORED = ("Q5", "Q6", "Q8")


def auto_weights(stored_as: str | None, device: torch.device, dtype: str) -> tuple[WeightsMode, str | None]:
    """The weights mode that follows the model file, and why, in a few words for the banner: a
    GGUF quantized to 4 bits or fewer runs int4, one of 5-8 bits int8, where the quantized CPU
    kernels can run it (the cpu device; a dtype they take): on tr's kernels wherever they run
    (quantized_dtype; on an AVX512-BF16 EPYC 2.6x the tokens/s of torch's, held-out prompts), else
    on torch's, with the bfloat16 weights for prompts (`+bf16`) on CPUs with native bfloat16
    matmuls (AVX512-BF16, AMX), as also when bfloat16 is asked. Anything else runs dense (a
    checkpoint: with no reason to give)."""
    from . import native_kernels

    kind = None
    if stored_as is not None:
        kind = "int4" if stored_as.startswith(_INT4_STORED) else "int8" if stored_as.startswith(_INT8_STORED) else None
    if kind is None:
        return DENSE, f"the file holds {stored_as} weights" if stored_as else None
    if device.type != "cpu":
        return DENSE, f"{stored_as} file; the quantized kernels are the CPU's"
    if dtype not in (AUTO, dtype_name(QUANTIZED_DTYPE)):
        return DENSE, f"{stored_as} file; dtype {dtype} asked"
    torch_kernels = dtype == dtype_name(QUANTIZED_DTYPE) or native_kernels.unavailable() is not None
    return WeightsMode(kind, torch_kernels and cpu_has_native_bf16()), f"the file holds {stored_as} weights"


# The banner's words for torch's kernels chosen where tr's could run (--dtype bfloat16, a +bf16
# mode): what they are for. Measured on SmolLM2, AVX-512 EPYC: int4 on torch's kernels 70.6 ms a
# one-token step and 507.8 ms an 80-node tree, against ~6 ms on tr's.
TORCH_KERNELS_WHERE_TRS_RUN = (
    "torch's kernels (meant for CPUs tr's cannot run on: a step costs about a one-token step per drafted "
    "token, so trees stay small; --weights int4 with --dtype auto runs tr's, ~10x faster steps)"
)


def quantized_dtype(mode: WeightsMode, dtype: str) -> tuple[torch.dtype, str]:
    """The dtype a quantized `mode` model computes in, which picks its kernels, and the kernels in
    words: float32 on tr's kernels where they can run (not with `+bf16`, a bfloat16 mode), else
    bfloat16 on torch's, saying why. SettingError for a dtype neither takes."""
    from . import native_kernels

    native_why_not = native_kernels.unavailable()
    why_not = native_why_not or ("they keep bfloat16 prompt weights" if mode.bf16_prompts else None)
    if dtype == AUTO:
        if why_not is None:
            return NATIVE_DTYPE, "tr's kernels"
        if native_why_not is None:  # asked for by a +bf16 mode where tr's kernels run
            return QUANTIZED_DTYPE, TORCH_KERNELS_WHERE_TRS_RUN
        return QUANTIZED_DTYPE, f"torch's kernels: tr's cannot run here, {why_not}"
    if dtype == dtype_name(QUANTIZED_DTYPE):
        return QUANTIZED_DTYPE, "torch's kernels" if native_why_not else TORCH_KERNELS_WHERE_TRS_RUN
    if dtype == dtype_name(NATIVE_DTYPE):
        if why_not is not None:
            raise SettingError(
                "weights", mode, f"computes in float32 on tr's kernels, which cannot run here: {why_not}; use bfloat16"
            )
        return NATIVE_DTYPE, "tr's kernels"
    raise SettingError(
        "weights", mode, "computes in float32 (tr's kernels) or bfloat16 (torch's); leave the dtype at auto"
    )


@dataclass(frozen=True)
class Runtime:
    """A model's device, the dtype it is loaded in, and its weights mode: one checked value."""

    device: torch.device
    dtype: torch.dtype
    weights: WeightsMode = DENSE
    chosen_because: str | None = None  # why, where the weights mode was chosen (`auto`)
    kernels: str | None = None  # which kernels a quantized mode runs on, in words (quantized_dtype)

    @classmethod
    def resolve(
        cls, device: str = "auto", dtype: str = "auto", weights: str = "dense", stored_as: str | None = None
    ) -> Runtime:
        """The settings as given (names, 'auto' allowed), checked together; SettingError names the
        first one that cannot run here. `stored_as`: the model file's matmul type, which `auto`
        weights follow (None: a checkpoint)."""
        torch_device = pick_device(device)
        if weights == AUTO:
            mode, why = auto_weights(stored_as, torch_device, dtype)
            if mode.dense:
                return cls(torch_device, pick_dtype(dtype, torch_device), mode, why)
            chosen, kernels = quantized_dtype(mode, dtype)
            return cls(torch_device, chosen, mode, why, kernels)
        if weights not in WEIGHTS_NAMES:
            raise SettingError("weights", weights, f"unknown; use {', '.join(WEIGHTS_NAMES)}")
        mode = WeightsMode.parse(weights)
        if mode.dense:
            return cls(torch_device, pick_dtype(dtype, torch_device), mode)
        if torch_device.type != "cpu":
            raise SettingError(
                "weights",
                mode,
                f"runs on torch's CPU kernels; use the cpu device, or dense weights on {torch_device.type}",
            )
        chosen, kernels = quantized_dtype(mode, dtype)
        return cls(torch_device, chosen, mode, kernels=kernels)

    def with_torch_kernels(self, why: str) -> Runtime:
        """This runtime on torch's kernels (bfloat16), where tr's were picked but failed to build."""
        return replace(self, dtype=QUANTIZED_DTYPE, kernels=f"torch's kernels: {why}")

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    def describe(self) -> str:
        """'bfloat16', 'int4+bf16 weights, bfloat16' or, chosen by `auto`, 'int4 weights (the
        file holds Q4_1 weights), bfloat16'."""
        why = f" ({self.chosen_because})" if self.chosen_because else ""
        if self.weights.dense:
            return f"{self.dtype_name}{why}"
        kernels = f" on {self.kernels}" if self.kernels else ""
        return f"{self.weights} weights{why}, {self.dtype_name}{kernels}"
