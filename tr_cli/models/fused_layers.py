"""A decoder layer on tr's kernels as a few calls (fused_layers.cpp), for models quantized onto them.

Between its int4 matmuls a one-token step ran ~45 small torch operations per layer (norms, the
rotary embedding, reshapes, SiLU and product), each a Python call and a dispatch: on SmolLM2 half
of a 28 ms step. Here the norms, the attention and the MLP are modules whose forward is one or two
calls into tr's kernels; they replace the model's own modules in place, as the quantized layers
replace its linear layers (no transformers code is touched), so `generate` and tr's forward run the
same functions and tr stays lossless against `generate` on that model. The decoder layers, the
embeddings (Gemma's scaled ones included), the rotary module, the masks and the cache stay the model's.

Taken only where the numbers cannot differ from what the model means: a float32 model of the direct
path's families (core/forward.py's DIRECT_FAMILIES: Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3) on tr's
row attention (row_attention.py), every norm an RMSNorm scaling by its weight or, as Gemma's, by
1 + weight (each norm's formula is checked on a probe input, not read off its class name), a SiLU or
tanh-GELU gated MLP, and each layer's q/k/v, o, gate/up and down on tr's kernels (q/k/v and gate/up
fused by models/weights.py, or already one projection in the checkpoint, as Phi-3's).

The fused modules and the whole-step object keep references to the quantized layers' tensors: the
model stays where it was quantized (tr's kernels are CPU-only), and a fused model is not copied or
pickled (`quantized_copy` copies the dense model before quantizing).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache

from ..core.forward import (
    DIRECT_FAMILIES,
    FUSED_GATE_UP,
    FUSED_QKV,
    ROW_ATTENTION,
    WHOLE_STEP,
    WholeAttention,
    rotary_index,
    rotary_kinds,
    sandwich_norms,
)
from ..core.kv_cache import CompactingCache

# The gated MLP activations the kernel computes, as fused_layers.cpp numbers them (tr::kSilu, kGeluTanh),
# each with the torch function it must agree with on a probe input.
ACTIVATIONS = {
    0: lambda x: nn.functional.silu(x),
    1: lambda x: nn.functional.gelu(x, approximate="tanh"),
}


def _probe(size: int) -> torch.Tensor:
    return torch.randn(3, size, generator=torch.Generator().manual_seed(7)) * 2


def norm_scale(norm: nn.Module | None) -> tuple[torch.Tensor, float] | None:
    """(s, eps) for an RMSNorm whose output is s * x / sqrt(mean(x²) + eps): s its weight (Llama) or
    1 + weight (Gemma), as float32 computes it; None for any other module (checked on a probe input)."""
    weight = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.dtype != torch.float32:
        return None
    if not isinstance(eps, float | int) or isinstance(norm, FusedRMSNorm):
        return None
    x = _probe(weight.numel())
    with torch.no_grad():
        out = norm(x)
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        for scale in (weight, 1.0 + weight):
            if torch.allclose(out, scale * normed, rtol=1e-5, atol=1e-6):
                return scale.detach(), float(eps)
    return None


def _activation(mlp: nn.Module) -> int | None:
    """The kernel's number for the MLP's activation (act_fn, or Phi-3's activation_fn), or None."""
    act = getattr(mlp, "act_fn", getattr(mlp, "activation_fn", None))
    if not callable(act):
        return None
    x = _probe(64)
    with torch.no_grad():
        out = act(x)
        return next((code for code, f in ACTIVATIONS.items() if torch.allclose(out, f(x), rtol=1e-5, atol=1e-6)), None)


class FusedRMSNorm(nn.Module):
    """transformers' RMSNorm (scale * x / sqrt(mean(x²) + eps)) in one call; the weight is the model's,
    the scale it or, for Gemma's norms, 1 + weight (norm_scale)."""

    def __init__(self, norm: nn.Module, scale: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = norm.weight
        self.scale = scale
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.ops.tr_kernels.rms_norm(hidden_states, self.scale, self.variance_epsilon)


class FusedAttention(WholeAttention):
    """The model's attention (q/k/v, the per-head q/k norms where it has them, rotary embedding, the
    cache's update, row attention soft-capped where the model caps it, o_proj) as two kernel calls
    around the cache update; the same inputs and outputs as the model's module."""

    def __init__(
        self,
        attention: nn.Module,
        qkv: nn.Module,
        heads: int,
        kv_heads: int,
        head_norms: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]] | None,
    ) -> None:
        super().__init__()
        self.layer_idx = attention.layer_idx
        self.head_dim = attention.head_dim
        self.scaling = float(attention.scaling)
        self.is_causal = bool(getattr(attention, "is_causal", True))
        self.softcap = float(getattr(attention, "attn_logit_softcapping", None) or 0.0)
        self.heads, self.kv_heads = heads, kv_heads
        self.qkv_proj = qkv
        self.o_proj = attention.o_proj
        self._qkv = qkv.operands()
        self._o = attention.o_proj.operands()
        (q_norm, eps), (k_norm, _) = head_norms if head_norms else ((None, 1e-6), (None, 1e-6))
        self._head_norms = (q_norm, k_norm, eps)

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
            hidden_states, *self._qkv, cos, sin, self.heads, self.kv_heads, *self._head_norms
        )
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        out = torch.ops.tr_kernels.attention_out(
            query, key, value, attention_mask, self.scaling, self.is_causal, *self._o, self.softcap
        )
        return out, None


class FusedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) in one call, gate and up the model's fused pair, act SiLU or
    tanh-GELU (ACTIVATIONS)."""

    def __init__(self, gate_up: nn.Module, down: nn.Module, activation: int) -> None:
        super().__init__()
        self.gate_up_proj = gate_up
        self.down_proj = down
        self.activation = activation
        self._operands = (*gate_up.operands(), *down.operands())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tr_kernels.gated_mlp(x, *self._operands, self.activation)


# A layer's norms by the role the kernels give them, under the names the model's layer calls them:
# (input, attention output's, MLP input's, MLP output's); None where the layer has none.
_LLAMA_NORMS = ("input_layernorm", None, "post_attention_layernorm", None)
_GEMMA_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def _norm_names(layer: nn.Module) -> tuple[str | None, ...]:
    return _GEMMA_NORMS if sandwich_norms(layer) else _LLAMA_NORMS


class FusedStack:
    """All decoder layers and the final norm of a model whose layers are all fused, as one call into
    fused_step.cpp (the weights gathered once): the direct forward's whole step (core/forward.py's
    WHOLE_STEP), the same functions on the same inputs as the model's modules."""

    def __init__(self, model: nn.Module, heads: int, kv_heads: int) -> None:
        body = model.model
        tensors: list[torch.Tensor | None] = []
        eps: list[float] = []
        activations, scales, softcaps = [], [], []
        for layer in body.layers:
            attention, mlp = layer.self_attn, layer.mlp
            norms = [getattr(layer, name) if name else None for name in _norm_names(layer)]
            q_norm, k_norm, head_eps = attention._head_norms
            tensors += [norms[0].scale, q_norm, k_norm, *attention._qkv, *attention._o]
            tensors += [norm.scale if norm is not None else None for norm in norms[1:]]
            tensors += mlp._operands
            eps += [norms[0].variance_epsilon, head_eps]
            eps += [norm.variance_epsilon if norm is not None else 0.0 for norm in norms[1:]]
            activations.append(mlp.activation)
            scales.append(attention.scaling)
            softcaps.append(attention.softcap)
        tensors.append(body.norm.scale)
        eps.append(body.norm.variance_epsilon)
        first = body.layers[0].self_attn
        self.layers = len(body.layers)
        rope = rotary_index(model, rotary_kinds(model))
        # What the cache's buffers are shaped after when it starts (CompactingCache.open_rows), made once.
        self._like = body.norm.scale.new_empty(1, kv_heads, 0, first.head_dim)
        self._stack = torch.classes.tr_kernels.FusedStack(
            tensors, eps, heads, kv_heads, rope, activations, scales, softcaps, first.is_causal
        )

    def __call__(
        self,
        hidden: torch.Tensor,
        cos: list[torch.Tensor],
        sin: list[torch.Tensor],
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


def _fused(module: nn.Module, name: str, checkpoint_name: str) -> nn.Module | None:
    """The sibling projections' one layer: models/weights.py's (`name`), or the checkpoint's own."""
    layer = getattr(module, name, None)
    return layer if layer is not None else getattr(module, checkpoint_name, None)


def _head_norms(attention: nn.Module) -> tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]] | None | bool:
    """The per-head q and k norms' (scale, eps) where the attention has them; None where it has none;
    False where it has some the kernels do not compute."""
    modules = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    if modules == (None, None):
        return None
    q, k = norm_scale(modules[0]), norm_scale(modules[1])
    if q is None or k is None or q[1] != k[1]:
        return False
    return q, k


def fuse_layers(model: nn.Module) -> int:
    """Replace each layer's norms, attention and MLP of a float32 model of the direct path's families on
    tr's kernels and row attention with the fused modules, in place; returns how many decoder layers
    changed (0: the model is not one this applies to, and nothing changed)."""
    config = model.config
    body = getattr(model, "model", None)
    if getattr(config, "_attn_implementation", None) != ROW_ATTENTION or body is None:
        return 0
    if getattr(config, "model_type", None) not in DIRECT_FAMILIES:
        return 0
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    fused = 0
    for layer in body.layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = _fused(attention, FUSED_QKV, "qkv_proj"), _fused(mlp, FUSED_GATE_UP, "gate_up_proj")
        names = [name for name in _norm_names(layer) if name]
        norms = [norm_scale(getattr(layer, name)) for name in names]
        head_norms, activation = _head_norms(attention), _activation(mlp)
        if not _on_kernels(qkv, attention.o_proj, gate_up, mlp.down_proj) or None in norms:
            continue
        if head_norms is False or activation is None:
            continue
        layer.self_attn = FusedAttention(attention, qkv, heads, kv_heads, head_norms)
        layer.mlp = FusedMLP(gate_up, mlp.down_proj, activation)
        for name, (scale, eps) in zip(names, norms, strict=True):
            setattr(layer, name, FusedRMSNorm(getattr(layer, name), scale, eps))
        fused += 1
    final = norm_scale(body.norm)
    if fused and final is not None:
        body.norm = FusedRMSNorm(body.norm, *final)
        if fused == len(body.layers):
            setattr(model, WHOLE_STEP, FusedStack(model, heads, kv_heads))
    return fused
