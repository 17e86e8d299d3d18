"""A GGUF's rotary settings that transformers' GGUF readers leave out, applied as llama.cpp applies them.

transformers' GGUF config maps read the rotary base and no scaling (only its gpt-oss reader tries),
so a model read from such a file would rotate with plain frequencies, unlike its checkpoint and
unlike llama.cpp on the same file. What llama.cpp's converter writes, and how it goes into the
config before the model is built (transformers' own rope types then do the rest):

- **Linear and YaRN** (`rope.scaling.type`, `.factor`; YaRN's `.original_context_length`): Gemma 3
  4B-27B (linear x8 on its global layers only, as in its checkpoint and in llama.cpp, whose sliding
  layers keep scale 1), YaRN Qwen2.5/Qwen3 files. As llama.cpp reads them: a factor without a type
  is linear, a factor of 0 or 1 or the type none scales nothing, YaRN takes betas 32 and 1 and the
  magnitude 0.1 ln(factor) + 1 times `rope.scaling.attn_factor` (the `yarn_*` keys a converter
  copies from a checkpoint are read by llama.cpp for a few other architectures only). Both are
  static: a position rotates the same way whatever the length.
- **LongRoPE** (Phi-3.5-mini, Phi-3-medium-128k, Phi-4-mini: architecture phi3): per-frequency
  factors for short and for long contexts (`rope_factors_short/long.weight`) with the pretraining
  context and attention factor (1 where the file has none) in metadata, as transformers' `longrope`
  parameters: the short factors up to the pretraining context (llama.cpp: while its context is no
  longer than that), cos and sin times the attention factor. transformers' phi3 map also drops
  `rope.dimension_count`; a partial rotary (Phi-4-mini rotates 96 of 128 dims) is set from it.
- **A sliding layer's base** (`rope.freq_base_swa`), where the config keeps one per layer type.
- **Llama 3.1+'s `rope_freqs.weight`**: the llama3 scaling as per-frequency divisors, the metadata
  naming no scaling; the built model's frequencies are divided by them (apply_rope_freqs).

A scaling transformers already read (its rope type not plain) is left as it is. Values that do not
fit (an unknown type, counts, non-positive or non-finite numbers, an attention factor on linear
scaling, which transformers cannot apply) are refused in one line.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn

from ..errors import ModelError
from .gguf_header import GGUFHeader
from .gguf_tensors import GGUFFile, vector

ROPE_FREQS = "rope_freqs.weight"
LONG_FACTORS, SHORT_FACTORS = "rope_factors_long.weight", "rope_factors_short.weight"


def _factors(file: GGUFFile, name: str, count: int, path: Path) -> list[float]:
    tensor = next(t for t in file.header.tensors if t.name == name)
    values = vector(file, tensor, torch.float64).reshape(-1)
    if values.numel() != count:
        raise ModelError(
            f"model {path.name}: {name} holds {values.numel()} factors for {count} rotary frequencies; "
            "the file is damaged or not what its metadata says"
        )
    if not bool(torch.isfinite(values).all()) or bool((values <= 0).any()):
        raise ModelError(f"model {path.name}: {name} holds factors that are not positive numbers; the file is damaged")
    return [float(v) for v in values.tolist()]


def _positive(header: GGUFHeader, key: str, path: Path) -> float | None:
    """A metadata number that must be finite and positive, or None where the file has no such key."""
    value = header.values.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ModelError(f"model {path.name}: {key} is {value!r}, not a positive number; the file is damaged")
    return float(value)


def _factor(header: GGUFHeader, path: Path) -> float | None:
    """The scaling factor under its key, or the older one llama.cpp still reads; None where there
    is none or it is 0 (llama.cpp: no scaling)."""
    arch = header.architecture
    for key in (f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear"):
        if key in header.values:
            return None if header.values[key] == 0 else _positive(header, key, path)
    return None


def _scaling_type(header: GGUFHeader, path: Path) -> str:
    """The file's rope scaling type; linear where it names none, as llama.cpp reads it."""
    arch = header.architecture
    kind = header.values.get(f"{arch}.rope.scaling.type", "linear")
    if kind not in ("none", "linear", "yarn", "longrope"):
        raise ModelError(
            f"model {path.name}: {arch}.rope.scaling.type is {kind!r}; tr reads none, linear, yarn and longrope"
        )
    return kind


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _original_context(config, header: GGUFHeader, path: Path) -> int:
    """The context the scaling extends: the file's original context, else its trained one."""
    arch = header.architecture
    trained = _positive(header, f"{arch}.context_length", path) or config.max_position_embeddings
    return int(_positive(header, f"{arch}.rope.scaling.original_context_length", path) or trained)


def _longrope(config, path: Path, header: GGUFHeader, names: set[str], rotary: dict) -> None:
    present = [name for name in (SHORT_FACTORS, LONG_FACTORS) if name in names]
    if len(present) < 2:  # one of them: set_rope_scaling comes here when the file holds either
        missing = LONG_FACTORS if present == [SHORT_FACTORS] else SHORT_FACTORS
        raise ModelError(f"model {path.name}: holds {present[0]} but no {missing}; the file is damaged")
    arch = header.architecture
    # As transformers counts the rotated dims (int(head_dim * partial)), which it checks the factors against.
    count = int(_head_dim(config) * rotary.get("partial_rotary_factor", 1.0)) // 2
    file = GGUFFile(path, header)
    try:
        short, long = (_factors(file, name, count, path) for name in (SHORT_FACTORS, LONG_FACTORS))
    finally:
        file.close()
    original = _original_context(config, header, path)
    rotary.update(rope_type="longrope", short_factor=short, long_factor=long, original_max_position_embeddings=original)
    # llama.cpp multiplies cos and sin by this (1 where the file has none, not transformers' default).
    rotary["attention_factor"] = _positive(header, f"{arch}.rope.scaling.attn_factor", path) or 1.0
    if hasattr(config, "original_max_position_embeddings"):
        config.original_max_position_embeddings = original


def _linear_or_yarn(config, path: Path, header: GGUFHeader, kind: str, factor: float, rotary: dict) -> None:
    arch = header.architecture
    attention = _positive(header, f"{arch}.rope.scaling.attn_factor", path)
    if kind == "linear":
        if attention not in (None, 1.0):
            raise ModelError(
                f"model {path.name}: linear rope scaling with an attention factor ({attention:g}) is not something "
                "transformers' rotary embeddings can apply; tr cannot run this file as llama.cpp does"
            )
        rotary.update(rope_type="linear", factor=factor)
        return
    # llama.cpp's betas (32, 1) and magnitude (0.1 ln(factor) + 1, times the file's attention factor),
    # whatever YaRN keys the converter copied from the checkpoint: it reads those for a few other
    # architectures only.
    magnitude = 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
    rotary.update(
        rope_type="yarn",
        factor=factor,
        original_max_position_embeddings=_original_context(config, header, path),
        beta_fast=32.0,
        beta_slow=1.0,
        attention_factor=magnitude * (attention or 1.0),
    )


def set_rope_scaling(config, path: Path, header: GGUFHeader) -> None:
    """Put the rotary scaling the file keeps outside transformers' config map into `config` (see
    the module's text); nothing for a file that has none."""
    arch = header.architecture
    parameters = copy.deepcopy(dict(getattr(config, "rope_parameters", None) or {}))
    if not parameters:  # no rotary embedding (mamba)
        return
    by_layer_type = isinstance(parameters.get("full_attention"), dict)
    # Global layers take the scaling (Gemma 3's checkpoint and llama.cpp alike); sliding ones keep theirs.
    rotary = parameters["full_attention"] if by_layer_type else parameters
    rotary_dims = header.values.get(f"{arch}.rope.dimension_count")
    if config.model_type == "phi3" and isinstance(rotary_dims, int) and 0 < rotary_dims < _head_dim(config):
        rotary["partial_rotary_factor"] = rotary_dims / _head_dim(config)
    names = {t.name for t in header.tensors}
    kind, factor = _scaling_type(header, path), _factor(header, path)
    if rotary.get("rope_type", "default") == "default":
        # LongRoPE goes by its factors, as in llama.cpp: without them a phi3 file rotates plainly.
        if SHORT_FACTORS in names or LONG_FACTORS in names:
            _longrope(config, path, header, names, rotary)
        elif kind in ("linear", "yarn") and factor not in (None, 1.0):
            _linear_or_yarn(config, path, header, kind, factor, rotary)
    sliding_base = _positive(header, f"{arch}.rope.freq_base_swa", path)
    if by_layer_type and sliding_base is not None and isinstance(parameters.get("sliding_attention"), dict):
        parameters["sliding_attention"]["rope_theta"] = sliding_base
    config.rope_parameters = parameters


def apply_rope_freqs(model: nn.Module, file: GGUFFile, path: Path) -> None:
    """The model's rotary frequencies divided by the file's ROPE_FREQS where it has them (without
    them a Llama 3.2's lowest frequencies would turn 32x too fast). Only over plain rotary
    frequencies (rope_type default): a scaling transformers already applies is not applied twice."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", None) != "default":
        return
    if not any(t.name == ROPE_FREQS for t in file.header.tensors):
        return
    frequencies = getattr(rotary, "inv_freq", None)
    if not isinstance(frequencies, torch.Tensor):
        raise ModelError(
            f"model {path.name}: {ROPE_FREQS} holds rotary factors but the model has no rotary frequencies; "
            "the file is damaged or not what its metadata says"
        )
    factors = torch.tensor(_factors(file, ROPE_FREQS, frequencies.numel(), path), dtype=torch.float32)
    scaled = frequencies / factors
    rotary.inv_freq = scaled
    rotary.original_inv_freq = scaled.clone()
