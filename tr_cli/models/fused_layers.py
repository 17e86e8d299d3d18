"""A Llama-family layer on tr's kernels as a few calls (fused_layers.cpp), for models quantized onto them.

Between its int4 matmuls a one-token step ran ~45 small torch operations per layer (norms, the
rotary embedding, reshapes, SiLU and product), each a Python call and a dispatch: on SmolLM2 half
of a 28 ms step. Here the norms, the attention and the MLP are modules whose forward is one or two
calls into tr's kernels; they replace the model's own modules in place, as the quantized layers
replace its linear layers (no transformers code is touched), so `generate` and tr's forward run the
same functions and tr stays lossless against `generate` on that model. The decoder layers, the
embeddings, the rotary module, the masks and the cache stay the model's.

Taken only where the numbers cannot differ from what the model means: a float32 Llama-family model
on tr's row attention (row_attention.py), RMSNorm as `weight * normed`, SiLU MLPs, and each layer's
q/k/v, o, gate/up and down on tr's kernels (the rotary embedding covers whole heads in these
families; attention_in refuses cos/sin of another size).

The fused modules and the whole-step object keep references to the quantized layers' tensors: the
model stays where it was quantized (tr's kernels are CPU-only), and a fused model is not copied or
pickled (`quantized_copy` copies the dense model before quantizing).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache

from ..core.forward import FUSED_GATE_UP, FUSED_QKV, ROW_ATTENTION, WHOLE_STEP, WholeAttention
from ..core.kv_cache import CompactingCache

_SILU = ("silu", "swish")


class FusedRMSNorm(nn.Module):
    """transformers' RMSNorm (weight * x / sqrt(mean(x²) + eps)) in one call; the weight is the model's."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = float(norm.variance_epsilon)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.ops.tr_kernels.rms_norm(hidden_states, self.weight, self.variance_epsilon)


class FusedAttention(WholeAttention):
    """The model's attention (q/k/v, rotary embedding, the cache's update, row attention, o_proj) as
    two kernel calls around the cache update; the same inputs and outputs as the model's module."""

    def __init__(self, attention: nn.Module, qkv: nn.Module, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.layer_idx = attention.layer_idx
        self.head_dim = attention.head_dim
        self.scaling = float(attention.scaling)
        self.is_causal = bool(getattr(attention, "is_causal", True))
        self.heads, self.kv_heads = heads, kv_heads
        self.qkv_proj = qkv
        self.o_proj = attention.o_proj
        self._qkv = qkv.operands()
        self._o = attention.o_proj.operands()

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,  # the cache's name before transformers 5.24
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]:
        cos, sin = position_embeddings
        query, key, value = torch.ops.tr_kernels.attention_in(
            hidden_states, *self._qkv, cos, sin, self.heads, self.kv_heads
        )
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        out = torch.ops.tr_kernels.attention_out(
            query, key, value, attention_mask, self.scaling, self.is_causal, *self._o
        )
        return out, None


class FusedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) in one call, gate and up the model's fused pair."""

    def __init__(self, gate_up: nn.Module, down: nn.Module) -> None:
        super().__init__()
        self.gate_up_proj = gate_up
        self.down_proj = down
        self._operands = (*gate_up.operands(), *down.operands())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tr_kernels.silu_mlp(x, *self._operands)


class FusedStack:
    """All decoder layers and the final norm of a model whose layers are all fused, as one call into
    fused_step.cpp (the weights gathered once): the direct forward's whole step (core/forward.py's
    WHOLE_STEP), the same functions on the same inputs as the model's modules."""

    def __init__(self, body: nn.Module, heads: int, kv_heads: int) -> None:
        tensors: list[torch.Tensor | None] = []
        eps: list[float] = []
        for layer in body.layers:
            attention, mlp = layer.self_attn, layer.mlp
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            tensors += [norms[0].weight, *attention._qkv, *attention._o, norms[1].weight, *mlp._operands]
            eps += [norm.variance_epsilon for norm in norms]
        tensors.append(body.norm.weight)
        eps.append(body.norm.variance_epsilon)
        first = body.layers[0].self_attn
        self.layers = len(body.layers)
        # What the cache's buffers are shaped after when it starts (CompactingCache.open_rows), made once.
        self._like = body.norm.weight.new_empty(1, kv_heads, 0, first.head_dim)
        self._stack = torch.classes.tr_kernels.FusedStack(tensors, eps, heads, kv_heads, first.scaling, first.is_causal)

    def __call__(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        masks: list[torch.Tensor | None],
        cache: CompactingCache,
    ) -> torch.Tensor:
        count = hidden.shape[1]
        keys, values, start = cache.open_rows(self.layers, count, self._like)
        out = self._stack.step(hidden, cos, sin, masks, keys, values, start)
        cache.advance(count)
        return out


def _on_kernels(*layers: nn.Module | None) -> bool:
    """On tr's kernels with exactly their outputs (no padded column block, whose extra outputs the
    fused calls would take for the next head's)."""
    return all(callable(getattr(layer, "operands", None)) and not layer.padded for layer in layers)


def _plain_norm(norm: nn.Module) -> bool:
    """An RMSNorm that scales by its weight (not 1 + weight, as Gemma's), with its epsilon where we read it."""
    weight = getattr(norm, "weight", None)
    return (
        type(norm).__name__.endswith("RMSNorm")
        and hasattr(norm, "variance_epsilon")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
    )


def fuse_layers(model: nn.Module) -> int:
    """Replace each layer's norms, attention and MLP of a float32 Llama-family model on tr's kernels and
    row attention with the fused modules, in place; returns how many decoder layers changed (0: the
    model is not one this applies to, and nothing changed)."""
    config = model.config
    body = getattr(model, "model", None)
    if getattr(config, "_attn_implementation", None) != ROW_ATTENTION or body is None:
        return 0
    if getattr(config, "hidden_act", None) not in _SILU:  # (rotary over part of a head: attention_in refuses)
        return 0
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    fused = 0
    for layer in body.layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = getattr(attention, FUSED_QKV, None), getattr(mlp, FUSED_GATE_UP, None)
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not (_on_kernels(qkv, attention.o_proj, gate_up, mlp.down_proj) and all(map(_plain_norm, norms))):
            continue
        layer.self_attn = FusedAttention(attention, qkv, heads, kv_heads)
        layer.mlp = FusedMLP(gate_up, mlp.down_proj)
        layer.input_layernorm = FusedRMSNorm(layer.input_layernorm)
        layer.post_attention_layernorm = FusedRMSNorm(layer.post_attention_layernorm)
        fused += 1
    if fused and _plain_norm(body.norm):
        body.norm = FusedRMSNorm(body.norm)
        if fused == len(body.layers):
            setattr(model, WHOLE_STEP, FusedStack(body, heads, kv_heads))
    return fused
