"""A GGUF's rotary settings that transformers' GGUF readers leave out, applied as llama.cpp applies them.

llama.cpp's converter keeps two kinds of rotary scaling as tensors, which transformers' GGUF loader
skips, so a model read from the file would rotate with plain frequencies, unlike the checkpoint
and unlike llama.cpp on the same file:

- **LongRoPE** (Phi-3.5-mini, Phi-3-medium-128k, Phi-4-mini: architecture phi3): per-frequency
  factors for short and for long contexts (`rope_factors_short/long.weight`), with the pretraining
  context and the attention factor in metadata (`rope.scaling.original_context_length`,
  `rope.scaling.attn_factor`). They go into the config, before the model is built, as
  transformers' own `longrope` parameters: its rotary module then divides the frequencies by the
  short factors up to the pretraining context (llama.cpp: while its context is no longer than that)
  and multiplies cos/sin by the attention factor, as llama.cpp does. transformers' phi3 config map
  also drops `rope.dimension_count`; a partial rotary (Phi-4-mini rotates 96 of 128 dims) is set
  from it.
- **Llama 3.1+'s `rope_freqs.weight`**: the llama3 scaling as per-frequency divisors, the metadata
  naming no scaling; the built model's frequencies are divided by them.

Factors that do not fit (count, non-positive, non-finite) are refused in one line: a damaged file.
"""

from __future__ import annotations

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


def set_longrope(config, path: Path, header: GGUFHeader) -> None:
    """Put a LongRoPE file's factors, pretraining context and attention factor into `config` (see
    the module's text), and a phi3 file's partial rotary; nothing for other files."""
    arch = header.architecture
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rotary_dims = header.values.get(f"{arch}.rope.dimension_count")
    parameters = dict(getattr(config, "rope_parameters", None) or {})
    if config.model_type == "phi3" and isinstance(rotary_dims, int) and 0 < rotary_dims < head_dim:
        parameters["partial_rotary_factor"] = rotary_dims / head_dim
    names = {t.name for t in header.tensors}
    present = [name for name in (SHORT_FACTORS, LONG_FACTORS) if name in names]
    if present:
        if len(present) == 1:
            missing = LONG_FACTORS if present == [SHORT_FACTORS] else SHORT_FACTORS
            raise ModelError(f"model {path.name}: holds {present[0]} but no {missing}; the file is damaged")
        count = int(head_dim * parameters.get("partial_rotary_factor", 1.0)) // 2
        file = GGUFFile(path, header)
        try:
            short, long = (_factors(file, name, count, path) for name in (SHORT_FACTORS, LONG_FACTORS))
        finally:
            file.close()
        trained = int(header.values.get(f"{arch}.context_length", config.max_position_embeddings))
        original = int(header.values.get(f"{arch}.rope.scaling.original_context_length", trained))
        attention = header.values.get(f"{arch}.rope.scaling.attn_factor")
        if original <= 0 or (attention is not None and not (math.isfinite(attention) and attention > 0)):
            raise ModelError(
                f"model {path.name}: its rope scaling metadata (original context {original}, attention factor "
                f"{attention}) is not usable; the file is damaged"
            )
        parameters.update(
            rope_type="longrope", short_factor=short, long_factor=long, original_max_position_embeddings=original
        )
        if attention is not None:
            parameters["attention_factor"] = float(attention)  # llama.cpp's, as the converter wrote it
        if hasattr(config, "original_max_position_embeddings"):
            config.original_max_position_embeddings = original
    if parameters:
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
