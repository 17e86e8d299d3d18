"""Tiny random GGUF files of any architecture transformers reads from GGUF, written with the `gguf`
package (llama.cpp's writer) from a transformers model: its config as the architecture's metadata
(transformers' own GGUF config map, inverted), its weights under llama.cpp's tensor names
(transformers' own GGUF name map, inverted, with the inverse of its tensor processor's changes),
each tensor in the ggml type asked for, and a byte-level BPE tokenizer padded to the vocabulary.

Types gguf can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16) are quantized from the model's
weights; the others (the K-quants) are random blocks with small scales: the file then holds other
values than the model, and a test compares against the file (gguf's dequantize), not the model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from transformers.convert_slow_tokenizer import bytes_to_unicode

# Offsets of each K-quant block's float16 scales (ggml-common.h), set to small values in random blocks.
_HALF_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
_GGUF_ARCH = {"gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "cohere": "command-r"}
FLOAT = (T.F32, T.F16, T.BF16)


def random_blocks(ggml_type: T, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """(rows, row bytes) uint8: random ggml blocks of `ggml_type`, their float16 scales in [1e-3, 1e-2]."""
    rng = np.random.default_rng(seed)
    block, size = gguf.GGML_QUANT_SIZES[ggml_type]
    raw = rng.integers(0, 256, size=(rows, columns // block, size), dtype=np.uint8)
    for offset in _HALF_FIELDS.get(ggml_type, ()):
        halves = rng.uniform(1e-3, 1e-2, size=raw.shape[:2]).astype(np.float16)
        raw[:, :, offset : offset + 2] = halves.view(np.uint8).reshape(*raw.shape[:2], 2)
    if ggml_type not in _HALF_FIELDS:  # a type gguf quantizes: its blocks from random values
        values = rng.standard_normal((rows, columns)).astype(np.float32) * 0.05
        return gguf.quants.quantize(values, ggml_type)
    return raw.reshape(rows, -1)


def encoded(array: np.ndarray, ggml_type: T, seed: int = 0) -> np.ndarray:
    """`array` (rows, columns) as `ggml_type` data: quantized where gguf can, else random blocks."""
    if ggml_type == T.F32:
        return array.astype(np.float32)
    try:
        return gguf.quants.quantize(array.astype(np.float32), ggml_type)
    except NotImplementedError:
        return random_blocks(ggml_type, *array.shape, seed=seed)


def _llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order (transformers' LlamaTensorProcessor undoes it): each
    head's two rotary halves interleaved."""
    dim = weights.shape[0] // heads // 2
    return weights.reshape(heads, 2, dim, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _to_file(arch: str, gguf_name: str, array: np.ndarray, config) -> np.ndarray:
    """The inverse of transformers' tensor processor for this architecture."""
    if arch == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name) and array.ndim == 2:
        heads = config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
        return _llama_permute(array, heads)
    if arch in ("gemma2", "gemma3") and "norm.weight" in gguf_name:
        return array + 1
    return array


def _tokens(vocab: int) -> list[str]:
    tokens = [*bytes_to_unicode().values(), "Ġt", "<|endoftext|>"]
    if vocab < len(tokens):
        raise ValueError(f"the tiny tokenizer needs a vocabulary of at least {len(tokens)}")
    return tokens[:-1] + [f"<extra_{i}>" for i in range(vocab - len(tokens))] + tokens[-1:]


def default_types(
    matrices: T = T.Q8_0, embedding: T | None = None, head: T | None = None
) -> Callable[[str, np.ndarray], T]:
    """Matrices in `matrices`, the token embedding in `embedding` and an untied output head in `head`
    (default: the same), vectors F32."""

    def pick(gguf_name: str, array: np.ndarray) -> T:
        if array.ndim < 2:
            return T.F32
        if gguf_name.startswith("token_embd") and embedding is not None:
            return embedding
        if gguf_name.startswith("output.") and head is not None:
            return head
        return matrices

    return pick


def write_tiny_gguf(
    path: Path,
    model: torch.nn.Module,
    types: Callable[[str, np.ndarray], T] | None = None,
    seed: int = 0,
    extra: dict[str, np.ndarray] | None = None,
    metadata: dict[str, int | float | str] | None = None,
) -> Path:
    """`model` (a transformers causal LM) as a GGUF at `path`, each tensor in `types(gguf name,
    array)`'s type (default_types()); `extra`: float32 tensors the file holds beside the model's
    (llama.cpp's rope_freqs.weight); `metadata`: further keys ("{arch}." prefixed), ints as uint32,
    floats as float32, strings as strings (what llama.cpp's converter writes beyond the config's keys)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    config = model.config
    arch = _GGUF_ARCH.get(config.model_type, config.model_type)
    types = types or default_types()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    for gguf_key, hf_key in GGUF_CONFIG_MAPPING.get(arch, GGUF_CONFIG_MAPPING.get(config.model_type, {})).items():
        value = getattr(config, hf_key, None) if hf_key else None
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            writer.add_uint32(f"{arch}.{gguf_key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{gguf_key}", value)
    for key, value in (metadata or {}).items():
        add = {int: writer.add_uint32, float: writer.add_float32, str: writer.add_string}[type(value)]
        add(f"{arch}.{key}", value)
    tokens = _tokens(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(["Ġ t"])
    writer.add_token_types([1] * (len(tokens) - 1) + [3])
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else len(tokens) - 1
    writer.add_bos_token_id(config.bos_token_id if isinstance(config.bos_token_id, int) else eos)
    writer.add_eos_token_id(eos)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    names = {hf: name for name, hf in get_gguf_hf_weights_map(model, processor).items()}
    state = model.state_dict()
    tied = getattr(config, "tie_word_embeddings", False)
    for index, (hf_name, tensor) in enumerate(state.items()):
        if hf_name not in names or (tied and hf_name.startswith("lm_head")):
            continue
        name = names[hf_name]
        array = _to_file(arch, name, tensor.detach().float().numpy(), config)
        ggml_type = types(name, array)
        if ggml_type == T.F32 or array.ndim < 2:
            writer.add_tensor(name, array.astype(np.float32))
        else:
            writer.add_tensor(name, encoded(array, ggml_type, seed + index), raw_dtype=ggml_type)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
