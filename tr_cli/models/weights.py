"""Weight-only quantized matmuls (`--weights int8|int4`): tr's own kernels on float32 models, torch's on
bfloat16 ones.

A one-token decoding step streams every weight once, so on a CPU its matmuls cost what the
weights weigh: int8 halves bf16's bytes, int4 quarters them (benchmarks/matmul_kernels.py). The
quantized layers replace the model's linear layers in place of the module objects (no transformers
code is touched), so `generate` and tr run the very same quantized model, and tr's output is
compared with `generate` on it. Which kernels a layer runs follows the model's dtype, chosen once in
Runtime.resolve:

- float32 model: tr's kernels (native_kernels.py; AVX2, compiled on first use). int4 as GGUF's Q4_1
  blocks (groups of 32 inputs, a float16 step and minimum each: a Q4_1 file's values come back bit for
  bit), int8 as Q8_0 (groups of 32, a float16 step), and a GGUF's 5-bit types as int5 (Q4_1's layout
  with levels 0-31); activations quantized per row to int8. Every row is computed alone, in one
  order, so a tree's rows equal one-token steps exactly.
- bfloat16 model: torch's weight-only kernels (their fast path: float32 activations are 5-20x slower
  there), as follows.

- int8: one symmetric scale per output row (`aten._weight_int8pack_mm`).
- int4: groups of 32 inputs with a scale and a minimum each, as GGUF's Q4_1 blocks
  (`aten._weight_int4pack_mm_for_cpu`); layers whose shape the kernel cannot take stay dense. The
  output head stays int8: its error lands on every logit. On SmolLM2 an int4 head raised the
  perplexity of our 30 prompts from 18.32 (dense) to 19.46; with the int8 head int4 gives 18.34
  (benchmarks/weights_quality.py). GGUF's Q4 mixes keep that tensor at Q8_0 too.
- int8+bf16 / int4+bf16: the same, plus the bfloat16 weights for prompts. The weight-only kernels
  cost ~linearly in rows past a few (int4: ~1.4 ms per row on SmolLM2 here), while bf16's GEMM
  amortizes its weights over the rows: a 256-token prompt takes ~240 ms dense against ~540 ms int4.
  So a call over several rows takes the bfloat16 weights (`generate`'s prefill, tr's prefill
  chunks), one row the quantized ones (a decoding step of `generate`), and so do the rows of tr's
  decoding steps (core/step_scope.py), each of which stands for one token `generate` computes
  alone. The kernels compute each row independently of the others in the call, so tr's output
  still compares with `generate` on the same model. The price is memory: the bf16 weights stay
  (in `tr bench` they are the dense model's own, shared).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.forward import FUSED_GATE_UP, FUSED_QKV
from ..core.kv_cache import KEEP_ROWS
from ..core.step_scope import in_decoding_step
from ..core.verify import ROW_TOPK
from ..errors import SettingError
from . import native_kernels
from .device import dtype_name
from .fused_layers import fuse_layers
from .row_attention import use_row_attention
from .runtime import NATIVE_DTYPE, QUANTIZED_DTYPE
from .weights_cache import Layout, quantized_buffers
from .weights_mode import DENSE, WeightsMode

INT4_GROUP = 32
_INT4_ROWS = 16  # the CPU int4 packing takes output sizes divisible by 16
_INT4_INNER_TILES = 2
_INT8_ROW_BYTES = 16  # torch's int8 kernel takes rows of whole 16-byte vectors


def _groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, in) weights as (out, in / 32, 32) groups of inputs, with each group's minimum and maximum."""
    out_features, in_features = weight.shape
    groups = weight.reshape(out_features, in_features // INT4_GROUP, INT4_GROUP)
    return groups, groups.amin(dim=-1), groups.amax(dim=-1)


class _QuantizedLinear(nn.Module):
    """y = x Wᵀ + b with W quantized; subclasses hold W and call their kernel in `_matmul`."""

    mode = ""
    compute_dtype = QUANTIZED_DTYPE  # the activations' dtype the kernel takes
    # Whether a row view holds exactly what quantizing those rows alone gives, by construction.
    rows_exact = False
    row_block = 1  # row views start and end at multiples of this

    def __init__(
        self, in_features: int, out_features: int, bias: torch.Tensor | None, buffers: dict[str, torch.Tensor]
    ) -> None:
        """A layer over already quantized `buffers` (the kernel's operands); `quantized` makes them."""
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(self.compute_dtype), requires_grad=False)
        for name, tensor in buffers.items():
            self.register_buffer(name, tensor)
        self.register_buffer("prompt_weight", None)  # (out, in) bfloat16 in a `+bf16` mode
        self.head = False  # the model's output head (`_prompt`)

    @classmethod
    def quantized(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> _QuantizedLinear:
        """`weight` (out, in) quantized into a new layer."""
        out_features, in_features = weight.shape
        buffers = quantized_buffers(cls.__name__, weight.detach().float(), cls._quantize, cls.layout(*weight.shape))
        return cls(in_features, out_features, bias, buffers)

    @staticmethod
    def _quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @staticmethod
    def layout(out_features: int, in_features: int) -> Layout:
        """The shape and dtype of each buffer `_quantize` gives for an (out, in) weight: what a
        weights cache replays must have them (weights_cache.py)."""
        raise NotImplementedError

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if flat.dtype != self.compute_dtype:  # checked here: a no-op call still costs ~1 µs, 211 times a step
            flat = flat.to(self.compute_dtype)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        if self.prompt_weight is not None and flat.shape[0] > 1 and not in_decoding_step():
            y = self._prompt(flat)
        else:
            y = self._quantized(flat)
        return y.view(*shape[:-1], self.out_features)

    def _quantized(self, flat: torch.Tensor) -> torch.Tensor:
        y = self._matmul(flat)
        return y if self.bias is None else y + self.bias

    def _prompt(self, flat: torch.Tensor) -> torch.Tensor:
        """A prompt's rows, as the dense layer computes them. The output head's last row stays
        quantized: it gives the first new token, which `generate` computes from that row alone
        (its prefill asks the head for the last position only); the other rows' logits only seed
        the matrix."""
        if not self.head:
            return F.linear(flat, self.prompt_weight, self.bias)
        return torch.cat([F.linear(flat[:-1], self.prompt_weight, self.bias), self._quantized(flat[-1:])])

    def _share(self, start: int, stop: int) -> _QuantizedLinear:
        """A layer computing output rows [start, stop) of this one on the same weight storage."""
        raise NotImplementedError

    def rows(self, start: int, stop: int) -> _QuantizedLinear:
        part = self._share(start, stop)
        part.bias = None if self.bias is None else nn.Parameter(self.bias[start:stop], requires_grad=False)
        if self.prompt_weight is not None:
            part.prompt_weight = self.prompt_weight[start:stop]
        return part

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.mode}"


class Int8Linear(_QuantizedLinear):
    mode = "int8"
    rows_exact = True  # one scale per row, rows stored one after another

    @staticmethod
    def _quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        scales = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        quantized = (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        return {"weight_int8": quantized.contiguous(), "scales": scales.to(QUANTIZED_DTYPE)}

    @staticmethod
    def layout(out_features: int, in_features: int) -> Layout:
        return {"weight_int8": ((out_features, in_features), torch.int8), "scales": ((out_features,), QUANTIZED_DTYPE)}

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.weight_int8, self.scales)

    @staticmethod
    def fits(out_features: int, in_features: int) -> bool:
        # The AVX-512 kernel reads weight rows with 16-byte aligned loads: other row lengths gave
        # wrong numbers, and crashed on some row counts (torch 2.13, Sapphire Rapids).
        return in_features % _INT8_ROW_BYTES == 0

    def _share(self, start: int, stop: int) -> Int8Linear:
        # Whole rows: contiguous views.
        views = {"weight_int8": self.weight_int8[start:stop], "scales": self.scales[start:stop]}
        return Int8Linear(self.in_features, stop - start, None, views)


class Int4Linear(_QuantizedLinear):
    mode = "int4"

    @staticmethod
    def _quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        out_features, in_features = weight.shape
        groups, low, high = _groups(weight)
        scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        levels = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15)
        levels = levels.to(torch.int32).reshape(out_features, in_features)
        # The kernel computes (q - 8) * scale + zero per group, so zero is the group's minimum
        # moved by 8 steps; it takes them as (groups, out, 2) in the activations' dtype.
        zeros = low + 8 * scales
        return {
            "scales_and_zeros": torch.stack([scales.t(), zeros.t()], dim=-1).to(QUANTIZED_DTYPE).contiguous(),
            "weight_int4": torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, _INT4_INNER_TILES),
        }

    @staticmethod
    def layout(out_features: int, in_features: int) -> Layout:
        return {
            "scales_and_zeros": ((in_features // INT4_GROUP, out_features, 2), QUANTIZED_DTYPE),
            "weight_int4": ((out_features, in_features // 2), torch.uint8),  # two levels a byte
        }

    @staticmethod
    def fits(out_features: int, in_features: int) -> bool:
        return out_features % _INT4_ROWS == 0 and in_features % INT4_GROUP == 0

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.weight_int4, INT4_GROUP, self.scales_and_zeros)

    def _share(self, start: int, stop: int) -> Int4Linear:
        # The CPU packing interleaves blocks of 64 output rows, so a view is whole rows only at block
        # boundaries (_fuse_siblings checks each); the (groups, out, 2) scales are copied contiguous.
        views = {
            "weight_int4": self.weight_int4[start:stop],
            "scales_and_zeros": self.scales_and_zeros[:, start:stop].contiguous(),
        }
        return Int4Linear(self.in_features, stop - start, None, views)


NATIVE_COLUMNS = 8  # tr's kernels take the output columns in blocks of eight (quantized_matmul.cpp)


def _column_blocks(levels: torch.Tensor, bytes_per_group: int) -> torch.Tensor:
    """(out, groups, 32) levels, out a multiple of 8, as the kernels read them: (out / 8, groups, 32 * 8)
    with inputs 4j..4j+3 of the block's eight columns side by side in its j-th 32 bytes; int4 puts the
    second half's vectors (inputs 16-31) in the high nibbles of the first half's; int5 puts int4's
    bytes of the low four bits first, then 32 bytes of fifth bits (bit v of byte k: vector v's byte k)."""
    out_features, groups, _ = levels.shape
    blocks = out_features // NATIVE_COLUMNS
    blocked = levels.reshape(blocks, NATIVE_COLUMNS, groups, 8, 4).permute(0, 2, 3, 1, 4)
    blocked = blocked.reshape(blocks, groups, 8, 32)
    if bytes_per_group in (16, 20):  # vector i (inputs 4i..) low nibbles, vector i + 4 (inputs 4(i+4)..) high
        nibbles = (blocked[:, :, :4] & 15) | ((blocked[:, :, 4:] & 15) << 4)
        if bytes_per_group == 16:
            blocked = nibbles
        else:
            shifts = torch.arange(8, dtype=torch.uint8).view(1, 1, 8, 1)
            fifth = (((blocked >> 4) & 1) << shifts).sum(dim=2, dtype=torch.int32).to(torch.uint8)
            blocked = torch.cat([nibbles.reshape(blocks, groups, -1), fifth], dim=2)
    return blocked.reshape(blocks, groups, -1).contiguous()


def _column_values(values: torch.Tensor) -> torch.Tensor:
    """(out, groups) per-group values as the kernels read them: (out / 8, groups, 8)."""
    out_features, groups = values.shape
    return values.reshape(out_features // NATIVE_COLUMNS, NATIVE_COLUMNS, groups).transpose(1, 2).contiguous()


def _columns_padded(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) with zero rows up to a multiple of 8 outputs (their outputs are cut off again)."""
    pad = -weight.shape[0] % NATIVE_COLUMNS
    return F.pad(weight, (0, 0, 0, pad)) if pad else weight


def _float16(values: torch.Tensor) -> torch.Tensor:
    finite = torch.finfo(torch.float16).max
    return values.clamp(-finite, finite).to(torch.float16)


class WeightSource(ABC):
    """A matmul weight not held as a float tensor (a GGUF file's blocks): what `quantize` takes for
    it instead of the layer's own weight, which may be on the meta device."""

    stored: str | None = None  # 'int4' / 'int5' / 'int8': the kind holding the stored values closest; None: float

    @abstractmethod
    def buffers(self, kind: type[_NativeLinear]) -> dict[str, torch.Tensor]:
        """`kind`'s buffers for this weight, outputs padded to a multiple of 8."""

    @abstractmethod
    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight's values as an (out, in) tensor."""


class _NativeLinear(_QuantizedLinear):
    """A layer on tr's kernels (native_kernels.py): float32 in and out, groups of 32 inputs, every
    row computed alone (so row views and tree rows are exact)."""

    compute_dtype = NATIVE_DTYPE
    rows_exact = True
    row_block = NATIVE_COLUMNS  # a row view starts and ends at a block of eight outputs

    @staticmethod
    def fits(out_features: int, in_features: int) -> bool:
        return in_features % INT4_GROUP == 0

    @classmethod
    def quantized(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> _NativeLinear:
        """`weight` (out, in) quantized, its outputs padded with zero weights to a multiple of 8 (the
        kernels' column blocks); the padded outputs are cut off (`padded`)."""
        out_features, in_features = weight.shape
        padded = _columns_padded(weight.detach().float())
        if bias is not None and padded.shape[0] != out_features:
            bias = F.pad(bias.detach(), (0, padded.shape[0] - out_features))
        buffers = quantized_buffers(cls.__name__, padded, cls._quantize, cls.layout(*padded.shape))
        layer = cls(in_features, padded.shape[0], bias, buffers)
        layer.out_features = out_features
        return layer

    @classmethod
    def from_source(cls, source: WeightSource, out_features: int, in_features: int, bias: torch.Tensor | None):
        """A layer over `source`'s buffers (WeightSource), as `quantized` makes one of a float weight."""
        buffers = source.buffers(cls)
        padded = buffers["levels"].shape[0] * NATIVE_COLUMNS
        if bias is not None and padded != out_features:
            bias = F.pad(bias.detach(), (0, padded - out_features))
        layer = cls(in_features, padded, bias, buffers)
        layer.out_features = out_features
        return layer

    @property
    def padded(self) -> bool:
        """Whether the kernels compute more outputs than the layer has (cut off after each call)."""
        return self.levels.shape[0] * NATIVE_COLUMNS != self.out_features

    def _share(self, start: int, stop: int) -> _NativeLinear:
        if start % NATIVE_COLUMNS or stop % NATIVE_COLUMNS or self.padded:
            raise ValueError(f"rows [{start}, {stop}) of a layer on tr's kernels: whole blocks of 8 only")
        block = slice(start // NATIVE_COLUMNS, stop // NATIVE_COLUMNS)
        views = {name: tensor[block] for name, tensor in self.named_buffers(recurse=False) if tensor is not None}
        return type(self)(self.in_features, stop - start, None, views)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One kernel call (it flattens the rows, adds the bias, shapes the output): ~120 calls a
        # step, where each Python line costs a microsecond or more.
        return self._outputs(x if x.dtype is NATIVE_DTYPE else x.to(NATIVE_DTYPE), self.bias)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self._outputs(x, None)

    def _outputs(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The kernel's outputs, the padding outputs cut off."""
        y = self._linear(x, bias)
        return y[..., : self.out_features] if self.padded else y

    def operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """What tr's kernels take for this layer (fused_layers.py passes them on): levels, steps,
        minimums (int4 only), bias."""
        raise NotImplementedError

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The layer's values in GGUF's order, padded outputs included: levels (out, in) as integers,
        steps and minimums (int4 only) (out, groups) float16."""
        raise NotImplementedError

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


class Q4Linear(_NativeLinear):
    """int4 as GGUF's Q4_1: per group of 32 inputs, levels 0-15, a float16 step and minimum."""

    mode = "int4"
    top = 15  # the highest level
    level_bytes = 16  # a column's bytes of levels per group of 32 inputs

    @classmethod
    def _quantize(cls, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        groups, low, high = _groups(weight)
        steps, minimums = _float16((high - low) / cls.top), _float16(low)
        # Levels against the float16 values the kernel uses: a Q4_1 tensor's own levels come back.
        step = steps.float().masked_fill(steps == 0, 1)[..., None]
        levels = ((groups - minimums.float()[..., None]) / step).round().clamp(0, cls.top).to(torch.uint8)
        return {
            "levels": _column_blocks(levels, cls.level_bytes),
            "steps": _column_values(steps),
            "minimums": _column_values(minimums),
        }

    @classmethod
    def layout(cls, out_features: int, in_features: int) -> Layout:
        blocks, groups = out_features // NATIVE_COLUMNS, in_features // INT4_GROUP
        values = ((blocks, groups, NATIVE_COLUMNS), torch.float16)
        levels = ((blocks, groups, cls.level_bytes * NATIVE_COLUMNS), torch.uint8)
        return {"levels": levels, "steps": values, "minimums": values}

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.tr_kernels.int4_mm(x, self.levels, self.steps, self.minimums, bias)

    def operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return self.levels, self.steps, self.minimums, self.bias

    def _vectors(self) -> torch.Tensor:
        """The levels as (blocks, groups, 8 vectors, 8 columns x 4 inputs)."""
        blocks, groups = self.levels.shape[:2]
        nibbles = self.levels[..., : 16 * NATIVE_COLUMNS].reshape(blocks, groups, 4, 32)
        return torch.cat([nibbles & 15, nibbles >> 4], dim=2)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return _unblocked(self._vectors()), _unblocked_values(self.steps), _unblocked_values(self.minimums)


class Q5Linear(Q4Linear):
    """int5 as GGUF's Q5_1: per group of 32 inputs, levels 0-31, a float16 step and minimum. What a
    GGUF's Q5_0, Q5_1 and Q5_K weights are held in as stored: 6 bits a weight against int8's 8.5,
    and a one-token step streams every weight from memory (a 0.5B Qwen2's Q5_0 layers: ~80 MB less
    a token)."""

    mode = "int5"
    top = 31
    level_bytes = 20  # int4's 16, then 4 bytes of fifth bits

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.tr_kernels.int5_mm(x, self.levels, self.steps, self.minimums, bias)

    def _vectors(self) -> torch.Tensor:
        blocks, groups = self.levels.shape[:2]
        planes = self.levels[..., 16 * NATIVE_COLUMNS :].reshape(blocks, groups, 1, 32)
        shifts = torch.arange(8, dtype=torch.uint8).view(1, 1, 8, 1)
        return super()._vectors() | (((planes >> shifts) & 1) << 4)


class Q8Linear(_NativeLinear):
    """int8 as GGUF's Q8_0: per group of 32 inputs, levels -127..127 and a float16 step."""

    mode = "int8"
    level_bytes = 32

    @staticmethod
    def _quantize(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        groups, low, high = _groups(weight)
        steps = _float16(torch.maximum(-low, high) / 127)
        step = steps.float().masked_fill(steps == 0, 1)[..., None]
        levels = (groups / step).round().clamp(-127, 127).to(torch.int8)
        return {"levels": _column_blocks(levels, 32), "steps": _column_values(steps)}

    @staticmethod
    def layout(out_features: int, in_features: int) -> Layout:
        blocks, groups = out_features // NATIVE_COLUMNS, in_features // INT4_GROUP
        return {
            "levels": ((blocks, groups, 32 * NATIVE_COLUMNS), torch.int8),
            "steps": ((blocks, groups, NATIVE_COLUMNS), torch.float16),
        }

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.tr_kernels.int8_mm(x, self.levels, self.steps, bias)

    def operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return self.levels, self.steps, None, self.bias

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        blocks, groups = self.levels.shape[:2]
        return _unblocked(self.levels.reshape(blocks, groups, 8, 32)), _unblocked_values(self.steps), None


def _unblocked(vectors: torch.Tensor) -> torch.Tensor:
    """(blocks, groups, 8 vectors, 8 columns x 4 inputs) -> (out, in): _column_blocks undone."""
    blocks, groups = vectors.shape[:2]
    columns = vectors.reshape(blocks, groups, 8, NATIVE_COLUMNS, 4).permute(0, 3, 1, 2, 4)
    return columns.reshape(blocks * NATIVE_COLUMNS, groups * INT4_GROUP)


def _unblocked_values(values: torch.Tensor) -> torch.Tensor:
    return values.transpose(1, 2).reshape(-1, values.shape[1])


# The layer class by the model's dtype (which picks the kernels, Runtime.resolve), then by mode.
_KINDS = {
    QUANTIZED_DTYPE: {"int8": Int8Linear, "int4": Int4Linear},
    NATIVE_DTYPE: {"int8": Q8Linear, "int4": Q4Linear},
}

# Sibling projections reading the same input, as Llama-family layers name them, and the attribute
# under which their fused layer is kept (core/forward.py's direct path calls it once instead of
# each sibling; the model's own forward still calls the siblings, row views of the fused weights).
FUSED_GROUPS = {FUSED_QKV: ("q_proj", "k_proj", "v_proj"), FUSED_GATE_UP: ("gate_proj", "up_proj")}


@dataclass(frozen=True)
class Quantized:
    """What `quantize` did: the mode and how many of the model's matmul weights it quantized."""

    mode: WeightsMode
    layers: int
    kept_dense: int


def _dense_weight(module: nn.Module) -> torch.Tensor | None:
    """A matmul layer's weight as (out, in): nn.Linear's, or GPT-2's Conv1D (stored (in, out))."""
    if isinstance(module, nn.Linear):
        return module.weight
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return module.weight.t()
    return None


def layer_kinds(dtype: torch.dtype, mode: WeightsMode) -> tuple[type[_QuantizedLinear], type[_QuantizedLinear]]:
    """The layer classes a `dtype` model quantized to `mode` gets: (its matmuls', its output head's);
    SettingError where that cannot run (tr's kernels not loaded, a `+bf16` mode on float32)."""
    kinds = _KINDS.get(dtype)
    if kinds is None:
        raise SettingError(
            "dtype", dtype_name(dtype), f"{mode} weights run on float32 (tr's kernels) or bfloat16 models"
        )
    if dtype == NATIVE_DTYPE:
        if mode.bf16_prompts:
            raise SettingError("weights", mode, "keeps bfloat16 prompt weights: load the model in bfloat16")
        if not native_kernels.loaded():
            raise SettingError("weights", mode, "on a float32 model runs tr's kernels, which are not loaded")
    return kinds[mode.quantized], kinds["int8"]


def quantize(model: nn.Module, mode: WeightsMode, sources: Mapping[str, WeightSource] | None = None) -> Quantized:
    """Replace a float32 or bfloat16 model's matmul layers with `mode` ones (the output head: int8),
    in place, on the kernels its dtype runs (layer_kinds); the rest stays as loaded (float32 buffers
    such as the rotary frequencies included). A `+bf16` mode keeps each layer's bfloat16 weight for
    prompts (the tensor itself, not a copy, where the layer is not fused). A model on tr's kernels
    also takes tr's row-exact attention where it can (row_attention.py), and then its layers' fused
    norms, attention and MLP (fused_layers.py).

    `sources` (tr's kernels only): the weights of the layers they name (module names) as stored in
    a file (WeightSource: a GGUF's blocks), whose layers' own weights may be on the meta device. A
    layer takes the kind holding its stored values closest where that is finer than `mode` (an int8
    Q6_K tensor in an int4 model; a Q5_0 one as int5 in either: _stored_kind), a fused group its
    finest member's kind, the head its stored kind (int8 for a float one)."""
    if mode.dense:
        return Quantized(mode, 0, 0)
    kind, head_kind = layer_kinds(next(model.parameters()).dtype, mode)
    sources = sources or {}
    if sources and not issubclass(kind, _NativeLinear):
        raise ValueError("stored weight sources are read into tr's kernels only (a float32 model)")
    keep = mode.bf16_prompts
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    layers = _fuse_siblings(model, kind, keep, sources)
    targets = [(name, module) for name, module in model.named_modules() if _dense_weight(module) is not None and name]
    kept = 0
    for name, module in targets:
        weight = _dense_weight(module)
        source = sources.get(name)
        layer_kind = head_kind if module is head else kind
        if source is not None:
            layer_kind = _stored_kind(kind, source.stored, head=module is head)
        if not layer_kind.fits(*weight.shape):
            if source is not None:  # stays dense: its values from the file
                module.weight = nn.Parameter(source.dense(NATIVE_DTYPE), requires_grad=False)
            kept += 1
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        bias = getattr(module, "bias", None)
        if source is None:
            layer = _layer(layer_kind, weight, bias, keep)
        else:
            layer = layer_kind.from_source(source, *weight.shape, bias)
        layer.head = module is head
        setattr(parent, child, layer)
        layers += 1
    if issubclass(kind, _NativeLinear):
        setattr(model, ROW_TOPK, native_kernels.row_topk)  # its logits are float32: verification's top-k
        setattr(model, KEEP_ROWS, native_kernels.keep_rows)  # the KV cache's compaction, in one call
        if use_row_attention(model):
            fuse_layers(model)
    return Quantized(mode, layers, kept)


# The kernels' kinds from the coarsest: a fused group takes its finest member's.
_FINENESS = (Q4Linear, Q5Linear, Q8Linear)


def _stored_kind(kind: type[_NativeLinear], stored: str | None, head: bool = False) -> type[_NativeLinear]:
    """The kind a stored weight takes in a `kind` model (quantize's `sources`): never coarser than
    the file holds it, nor than the mode asks, where int5 stands for int8 in an int8 model: a layer
    stored in 4 or 5 bits is held as int5 there (its stored levels and steps, closer to the file
    than an int8 requantization, in 6 bits a weight). A head: its stored kind, int8 for a float one."""
    if head:
        return Q4Linear if stored == "int4" and kind is Q4Linear else Q8Linear
    if stored == "int8" or (kind is Q8Linear and stored is None):
        return Q8Linear
    if stored == "int5" or kind is Q8Linear:
        return Q5Linear
    return Q4Linear


def _layer(
    kind: type[_QuantizedLinear], weight: torch.Tensor, bias: torch.Tensor | None, keep: bool
) -> _QuantizedLinear:
    """A `kind` layer of `weight`; with `keep` (a `+bf16` mode) it keeps the weight for prompts."""
    layer = kind.quantized(weight, bias)
    if keep:
        layer.prompt_weight = weight.detach().to(QUANTIZED_DTYPE)
    return layer


def _fuse_siblings(
    model: nn.Module, kind: type[_QuantizedLinear], keep: bool, sources: Mapping[str, WeightSource]
) -> int:
    """Quantize each FUSED_GROUPS group as one layer over the concatenated weights (per-row scales
    and groups make that the same numbers), kept as `parent.<fused name>`; each sibling becomes a
    row view of it. A group whose views would not hold exactly what the sibling quantized alone
    holds (torch's int4 packing interleaves blocks of rows) stays unfused. A group read from
    `sources` takes its finest member's kind, its buffers concatenated. Returns how many siblings
    were replaced."""
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        for fused_name, names in FUSED_GROUPS.items():
            siblings = [getattr(parent, name, None) for name in names]
            weights = [_dense_weight(m) if isinstance(m, nn.Module) else None for m in siblings]
            if any(w is None for w in weights) or len({w.shape[1] for w in weights}) != 1:
                continue
            stored = [sources.get(f"{parent_name}.{name}" if parent_name else name) for name in names]
            if any(s is None for s in stored) and any(s is not None for s in stored):
                continue
            group_kind = kind
            if stored[0] is not None:
                group_kind = max((_stored_kind(kind, s.stored) for s in stored), key=_FINENESS.index)
            if not all(group_kind.fits(*w.shape) for w in weights):
                continue
            biases = [getattr(m, "bias", None) for m in siblings]
            if any(b is None for b in biases) and any(b is not None for b in biases):
                continue
            bounds = torch.tensor([0, *[w.shape[0] for w in weights]]).cumsum(0).tolist()
            if any(bound % group_kind.row_block for bound in bounds):
                continue
            bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            if stored[0] is not None:
                parts = [s.buffers(group_kind) for s in stored]
                buffers = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
                fused = group_kind(weights[0].shape[1], bounds[-1], bias, buffers)
            else:
                fused = _layer(group_kind, torch.cat([w.detach() for w in weights]), bias, keep)
            views = [fused.rows(start, stop) for start, stop in zip(bounds, bounds[1:], strict=False)]
            if not group_kind.rows_exact:  # compare with each sibling quantized alone; keep those if they differ
                alone = [_layer(group_kind, w, b, keep) for w, b in zip(weights, biases, strict=True)]
                if not all(_same_tensors(view, own) for view, own in zip(views, alone, strict=True)):
                    views, fused = alone, None
            if fused is not None:
                setattr(parent, fused_name, fused)
            for name, layer in zip(names, views, strict=True):
                setattr(parent, name, layer)
            replaced += len(names)
    return replaced


def _same_tensors(a: nn.Module, b: nn.Module) -> bool:
    mine, theirs = a.state_dict(), b.state_dict()
    return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def quantized_copy(model: nn.Module, mode: WeightsMode) -> nn.Module:
    """A `mode` copy of a float32 or bfloat16 model sharing every tensor `quantize` keeps
    (embeddings, norms), so a bench compares both in one process at the cost of the quantized
    weights only. The copy computes in the model's dtype (a cast would convert the shared tensors)."""
    layer_kinds(next(model.parameters()).dtype, mode)  # refused before anything is copied
    shared = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, memo=dict(shared))
    quantize(twin, mode)
    return twin


def weights_mode(model: nn.Module) -> WeightsMode:
    """The mode a model's layers were quantized with (an int4 model's head is int8)."""
    layers = [module for module in model.modules() if isinstance(module, _QuantizedLinear)]
    modes = {layer.mode for layer in layers}
    if not modes:
        return DENSE
    return WeightsMode("int4" if "int4" in modes else "int8", any(layer.prompt_weight is not None for layer in layers))
