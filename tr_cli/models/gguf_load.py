"""A transformers model over a GGUF file's own tensors, without a float checkpoint.

The model is built from the GGUF's config on the meta device (no memory), then each of its tensors
is put in from the file (gguf_tensors.py): on tr's kernels the matmul weights go from their ggml
blocks straight into the kernels' buffers (quantize's `sources`), the token embedding stays
quantized (tied: quantized_embedding.py, the head's layer over the same buffers; untied: read from
the file where it lies, file_embedding.py), norms and biases
are float32; any other run (dense weights, bfloat16, a GPU) takes every tensor dequantized in its
dtype, one at a time, and quantizes as for a checkpoint. Buffers the model computes (the rotary
frequencies) are computed as transformers' own loading computes them, then divided by a Llama 3.1+
file's rope frequency factors, as llama.cpp applies them (gguf_rope.py).
transformers' GGUF tensor-name map and tensor processor say which tensor is which parameter, and in
which row order.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import ModelError
from .file_embedding import FileEmbedding
from .gguf_blocks import readable, type_name
from .gguf_header import read_header
from .gguf_rope import apply_rope_freqs
from .gguf_tensors import GGUFFile, GGUFWeight, vector
from .quantized_embedding import QuantizedEmbedding
from .runtime import NATIVE_DTYPE
from .weights import Quantized, _stored_kind, layer_kinds, quantize
from .weights_mode import WeightsMode


def _refuse_unreadable(path: Path, header) -> None:
    """One line naming the first tensor whose type this reader cannot take, before anything is allocated."""
    for tensor in header.tensors:
        if not readable(tensor.ggml_type):
            raise ModelError(
                f"model {path.name}: tensor {tensor.name} is stored as {type_name(tensor.ggml_type)}, which tr "
                "cannot read; convert the file to another quantization (llama-quantize) or pass a checkpoint"
            )


def _meta_model(config, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
        except ValueError as exc:  # an architecture without SDPA support: its own attention then
            if not any(word in str(exc).lower() for word in ("sdpa", "scaled_dot_product_attention")):
                raise
            return AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)


class _Names:
    """transformers' map of GGUF tensor names to the model's parameters, and its tensor processor
    (the row order and value changes its GGUF loader applies)."""

    def __init__(self, model: nn.Module, architecture: str) -> None:
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
        )

        self.config = model.config.to_dict()
        self.processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=self.config)
        # The map's walk builds gguf's name table once per submodule (~400 times, 15 s for a
        # 30-layer model); the model's own names are mapped in one pass, the walk only where that
        # leaves a parameter out (Bloom's names sit on a submodule).
        self.map = get_gguf_hf_weights_map(_Flat(model), self.processor)
        if not {name for name, _ in model.named_parameters()} <= set(self.map.values()):
            self.map = get_gguf_hf_weights_map(model, self.processor)

    def _process(self, values: np.ndarray, name: str):
        return self.processor.process(
            weights=values,
            name=name,
            tensor_key_mapping=self.map,
            parsed_parameters={"tensors": {}, "config": self.config},
        )

    def row_order(self, name: str, rows: int) -> torch.Tensor | None | bool:
        """The processor's change to a matrix as a permutation of its rows (None: none); False where
        it does more than reorder rows (then its values are processed as floats)."""
        result = self._process(np.arange(rows, dtype=np.float64).reshape(rows, 1), name)
        order = np.asarray(result.weights).reshape(-1)
        if result.name != name or order.shape != (rows,) or not np.array_equal(np.sort(order), np.arange(rows)):
            return False
        if np.array_equal(order, np.arange(rows)):
            return None
        return torch.from_numpy(order.astype(np.int64))

    def values(self, name: str, values: torch.Tensor) -> torch.Tensor:
        result = self._process(values.numpy(), name)
        return torch.from_numpy(np.ascontiguousarray(result.weights)).to(values.dtype)


class _Flat:
    """The model as get_gguf_hf_weights_map reads it (config, state dict names), without submodules."""

    def __init__(self, model: nn.Module) -> None:
        self.config = model.config
        self._names = list(model.state_dict())

    def state_dict(self) -> dict[str, None]:
        return dict.fromkeys(self._names)

    def named_children(self) -> list:
        return []


def _set(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, attribute = name.rpartition(".")
    module = model.get_submodule(owner)
    module._parameters[attribute] = nn.Parameter(tensor, requires_grad=False)


def _check_shape(path: Path, gguf_name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise ModelError(
            f"model {path.name}: tensor {gguf_name} has shape {list(got)}, but its config makes "
            f"{list(want)}; the file is damaged or not what its metadata says"
        )


class _FloatWeight(GGUFWeight):
    """A matrix whose processor changes values (not only the row order): processed as floats."""

    def __init__(self, weight: GGUFWeight, names: _Names) -> None:
        super().__init__(weight.file, weight.tensor)
        self._values = names.values(weight.tensor.name, super().dense(torch.float32))

    def buffers(self, kind):
        from .weights import _columns_padded

        return kind._quantize(_columns_padded(self._values))

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        return self._values.to(dtype)


def load_gguf_model(path: Path, config, generation_config, mode: WeightsMode, dtype: torch.dtype) -> nn.Module:
    """The model of the GGUF at `path` with `config` (gguf_cache.py's conversion), its weights in
    `mode` and `dtype`: straight from the file's blocks on tr's kernels (a quantized mode in
    float32), else dequantized in `dtype`. ModelError for a tensor it cannot take."""
    header = read_header(path)
    _refuse_unreadable(path, header)
    direct = not mode.dense and dtype == NATIVE_DTYPE
    if direct:
        kind, _ = layer_kinds(dtype, mode)  # SettingError where tr's kernels are not loaded
    model = _meta_model(config, dtype)
    if generation_config is not None:
        model.generation_config = generation_config
    names = _Names(model, header.architecture)
    file = GGUFFile(path, header)
    try:
        sources = _fill(model, file, names, path, dtype, kind if direct else None)
        _materialize_buffers(model, path)
        apply_rope_freqs(model, file, path)
        _tie(model)
        if direct:
            quantize(model, mode, sources)
        del sources
    finally:
        file.close()
    _check_whole(model, path)
    return model.eval()


def _fill(model: nn.Module, file: GGUFFile, names: _Names, path: Path, dtype: torch.dtype, kind):
    """Put the file's tensors into the meta model; returns the matmul weights left as sources
    (module name -> GGUFWeight) where `kind` (tr's kernels) takes them from the blocks."""
    params = dict(model.named_parameters(remove_duplicate=False))
    embeddings = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    sources: dict[str, GGUFWeight] = {}
    for tensor in file.header.tensors:
        name = names.map.get(tensor.name)
        if name is None or name not in params:
            continue  # tensors transformers' loader skips too (rope_freqs, ...)
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        want = tuple(params[name].shape)
        matrix = len(want) == 2 and attribute == "weight"
        if matrix and (isinstance(owner, nn.Linear) or (owner is embeddings and isinstance(owner, nn.Embedding))):
            weight = GGUFWeight(file, tensor)
            _check_shape(path, tensor.name, weight.shape, want)
            order = names.row_order(tensor.name, weight.rows)
            weight = _FloatWeight(weight, names) if order is False else GGUFWeight(file, tensor, order)
            if kind is None:
                _set(model, name, weight.dense(dtype))
            elif owner is embeddings:
                plain = type(owner) is nn.Embedding
                scale = None if plain or weight.stored is None else _lookup_scale(model, owner)
                if weight.stored is None or (not plain and scale is None) or (order is not None and not tied):
                    # a subclass computing more than scaled rows, or an untied embedding whose rows the
                    # processor reorders (never seen): kept dense
                    _set(model, name, weight.dense(dtype))
                    continue
                parent, _, child = owner_name.rpartition(".")
                if not tied:
                    lookup = FileEmbedding(file.path, file.header.data_start, tensor, owner.padding_idx, scale)
                    setattr(model.get_submodule(parent), child, lookup)
                    continue
                layer = _stored_kind(kind, weight.stored, head=True).from_source(weight, *want, None)
                setattr(model.get_submodule(parent), child, QuantizedEmbedding(layer, owner.padding_idx, scale))
                head_name = next(n for n, m in model.named_modules() if m is head)
                hparent, _, hchild = head_name.rpartition(".")
                layer.head = True
                setattr(model.get_submodule(hparent), hchild, layer)
            else:
                sources[owner_name] = weight
            continue
        values = vector(file, tensor, torch.float32)
        _check_shape(path, tensor.name, tuple(values.shape), want)
        _set(model, name, names.values(tensor.name, values).to(dtype))
    return sources


def _lookup_scale(model: nn.Module, embeddings: nn.Embedding) -> torch.Tensor | None:
    """What a subclass of nn.Embedding multiplies its looked-up rows by (Gemma's `embed_scale`,
    sqrt(hidden)); None for one that computes anything else. The subclass's own forward is run on a
    probe of a few rows, its buffers computed as transformers' loading computes them, and the factor
    is kept only where it gives that forward's output bit for bit: a quantized embedding then scales
    its rows as the model would (a dense float32 copy of a 262,144-token embedding is 671 MB)."""
    if getattr(embeddings, "embed_scale", None) is None:
        return None
    probe = copy.deepcopy(embeddings)  # its weight on the meta device: nothing allocated
    probe.weight = nn.Parameter(torch.empty(4, embeddings.embedding_dim), requires_grad=False)
    probe.to_empty(device="cpu", recurse=False)
    probe.padding_idx = None
    ids = torch.tensor([[2, 0, 3, 1]])
    with torch.no_grad():
        try:  # an embedding this probe cannot run is kept dense, never a failed load
            model._init_weights(probe)  # the scale buffer's value (on the meta device until now)
            probe.weight.copy_(torch.randn(4, embeddings.embedding_dim, generator=torch.Generator().manual_seed(0)))
            factor = torch.as_tensor(probe.embed_scale, dtype=torch.float32).detach().clone()
            scaled = probe(ids)
        except (RuntimeError, TypeError, ValueError, IndexError, AttributeError):
            return None
    return factor if factor.numel() == 1 and torch.equal(scaled, probe.weight[ids] * factor) else None


def _tie(model: nn.Module) -> None:
    """A tied head's weight is the embedding's (the meta model's tie points at the meta tensor)."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if not isinstance(head, nn.Linear) or not isinstance(embeddings, nn.Embedding):
        return  # a quantized tied head is already the embedding's layer
    if getattr(model.config, "tie_word_embeddings", False) and head.weight.is_meta:
        head.weight = embeddings.weight


def _materialize_buffers(model: nn.Module, path: Path) -> None:
    """Buffers still on the meta device (computed at construction: the rotary frequencies) computed
    on the CPU as transformers' loading does (its `_init_weights` for that module)."""
    for module in model.modules():
        if any(b is not None and b.is_meta for b in module.buffers(recurse=False)):
            # _init_weights sets a module's parameters too (a norm's to ones): the file's values are kept
            kept = {n: p.detach().clone() for n, p in module.named_parameters(recurse=False) if not p.is_meta}
            module.to_empty(device="cpu", recurse=False)
            with torch.no_grad():
                model._init_weights(module)
                for n, value in kept.items():
                    getattr(module, n).copy_(value)


def _check_whole(model: nn.Module, path: Path) -> None:
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise ModelError(
                f"model {path.name}: the file has no tensor for {name}; it is damaged or not what its metadata says"
            )


__all__ = ["Quantized", "load_gguf_model"]
