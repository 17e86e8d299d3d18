"""The forward pass a decoding step runs: new tokens at given positions, a 4D mask, our KV cache.

Two paths, the same logits bit for bit:
- `ModelForward`: the model's own `forward` through its public inputs (4D mask, position ids, the
  cache API). Any architecture.
- `LlamaFamilyForward`: for Llama, Qwen2, Qwen3, Mistral, Phi-3 and Gemma 2/3 text decoders
  (DIRECT_FAMILIES), the model's own modules and
  functions (norms, projections, rotary embedding, MLP, transformers' attention function) called
  in the order the model's forward calls them, without the per-call machinery around them
  (argument plumbing, output records, mask dispatch, cache indirection), and q/k/v and gate/up
  as one matmul each where the quantized weights keep them fused (models/weights.py), and
  grouped-query attention over several tokens without copying the cache per query head
  (`grouped_sdpa`). On SmolLM2 that saves ~1 ms of a 38 ms bf16 step and ~3 ms of an 18 ms int4
  one (benchmarks/results/forward_paths-bfloat16.json), and ~1.5 ms more of a 3-token int4 tree
  step. The tests check that both paths give identical logits and caches on every supported
  architecture.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .kv_cache import CompactingCache

Mask = torch.Tensor | dict[str, torch.Tensor]

# config.model_type of the decoders whose layers are exactly: norm -> q/k/v (one fused projection in
# Phi-3's checkpoints) -> per-head q/k norms (Qwen3, Gemma 3) -> rotary -> cache -> attention (soft-capped
# in Gemma 2) -> o_proj -> [norm: Gemma] -> residual -> norm -> mlp -> [norm: Gemma] -> residual, then the
# final norm, the head and [soft-capped logits: Gemma 2] (transformers 5.13-5.24). Gemma 3's multimodal
# "gemma3" (a language model inside a vision one) is not among them.
DIRECT_FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "phi3", "gemma2", "gemma3_text")
# The families whose q/k norms come after the heads' transpose (Qwen3 norms before it).
_HEAD_NORM_AFTER_TRANSPOSE = ("gemma3_text",)
# Where a layer keeps one matmul for sibling projections reading the same input (q/k/v, gate/up):
# models/weights.py sets them on the attention and MLP modules it quantizes, the direct path calls them.
FUSED_QKV = "fused_qkv"
FUSED_GATE_UP = "fused_gate_up"
# The attention implementations whose function the direct path calls as the model does: transformers'
# own, and tr's row-exact one (models/row_attention.py registers it under this name).
ROW_ATTENTION = "tr_rows"
_ATTENTION_KERNELS = ("sdpa", "eager", ROW_ATTENTION)
# A callable a model may carry (models/fused_layers.py sets it where every layer is fused) running all
# decoder layers and the final norm in one call: (hidden (1, T, H), cos and sin: lists, one per
# `rotary_kinds` entry, masks: one per layer or one for all, cache: CompactingCache) -> the final norm's
# output. The direct path calls it in place of the layers; it computes what they compute, bit for bit.
WHOLE_STEP = "tr_whole_step"


def takes_batches(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward takes several sequences in one call: not on tr's row attention (it
    and the fused layers built on it take batch 1). Whatever feeds a model batches through this."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) != ROW_ATTENTION


class WholeAttention(torch.nn.Module):
    """An attention module that computes its projections, rotary embedding and cache update itself,
    called with the model's own arguments (hidden states, position_embeddings, attention_mask, cache);
    returns (output, None). The direct path calls it as the model does (models/fused_layers.py)."""


class ModelForward:
    """The model's own forward: works for every causal LM transformers loads."""

    name = "model"

    def __init__(self, model: torch.nn.Module, cache_keyword: str) -> None:
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self._cache_keyword = cache_keyword
        # transformers' way of asking the head for the last rows only; a model without it computes all.
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: Mask,
        cache: CompactingCache,
        last_only: bool = False,
    ) -> torch.Tensor:
        keep = {"logits_to_keep": 1} if last_only and self._keeps_logits else {}
        out = self.model(
            input_ids=input_ids[None],
            attention_mask=mask,
            position_ids=positions[None],
            use_cache=True,
            **{self._cache_keyword: cache},
            **keep,
        )
        logits = out.logits[0, -1:] if last_only else out.logits[0]
        # With device_map="auto" the head may sit on another device than the embeddings.
        return logits.to(self.device)


def sandwich_norms(layer: torch.nn.Module) -> bool:
    """Gemma's layer: norms on the attention's and the MLP's outputs too (post_attention_layernorm is
    then the attention output's, pre_feedforward_layernorm the MLP input's)."""
    return hasattr(layer, "pre_feedforward_layernorm") and hasattr(layer, "post_feedforward_layernorm")


def rotary_kinds(model: torch.nn.Module) -> list[str | None]:
    """The rotary embeddings a step computes: one per layer type where the model's rotary module takes
    one (Gemma 3: local and global bases), in the config's first-seen order; else one for all ([None])."""
    rotary = model.model.rotary_emb
    if "layer_type" not in inspect.signature(rotary.forward).parameters:
        return [None]
    return list(dict.fromkeys(model.config.layer_types))


def rotary_index(model: torch.nn.Module, kinds: list[str | None]) -> list[int]:
    """Which of `kinds` each decoder layer takes."""
    if kinds == [None]:
        return [0] * model.config.num_hidden_layers
    return [kinds.index(kind) for kind in model.config.layer_types[: model.config.num_hidden_layers]]


class LlamaFamilyForward:
    """A DIRECT_FAMILIES decoder composed from its own modules, for less per-step overhead."""

    name = "direct"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        config = model.config
        body = model.model
        self.embed = body.embed_tokens
        self.rotary = body.rotary_emb
        self.layers = list(body.layers[: config.num_hidden_layers])
        self.norm = body.norm
        self.head = model.lm_head
        # The rotary and attention functions the model's own attention calls, looked up as it does.
        family = sys.modules[type(self.layers[0]).__module__]
        self.apply_rotary: Callable = family.apply_rotary_pos_emb
        self.attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            config._attn_implementation, family.eager_attention_forward
        )
        self.layer_types = getattr(config, "layer_types", None)
        self.rotary_kinds = rotary_kinds(model)
        self.rotary_index = rotary_index(model, self.rotary_kinds)
        self.sandwich = sandwich_norms(self.layers[0])
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.norm_after_transpose = config.model_type in _HEAD_NORM_AFTER_TRANSPOSE
        self.logit_cap: float | None = getattr(config, "final_logit_softcapping", None)
        self.whole_step: Callable | None = getattr(model, WHOLE_STEP, None)

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """A DIRECT_FAMILIES model on one device, with an attention kernel whose function we call as
        the model does; anything else takes the model's own forward."""
        config = getattr(model, "config", None)
        if getattr(config, "model_type", None) not in DIRECT_FAMILIES:
            return False
        if getattr(config, "_attn_implementation", None) not in _ATTENTION_KERNELS:
            return False
        placement = getattr(model, "hf_device_map", None)
        if placement and len(set(placement.values())) > 1:  # accelerate's hooks sit on whole layers
            return False
        body = getattr(model, "model", None)
        parts = all(hasattr(body, part) for part in ("embed_tokens", "rotary_emb", "layers", "norm"))
        family = sys.modules.get(type(body.layers[0]).__module__) if parts and len(body.layers) else None
        functions = all(hasattr(family, f) for f in ("apply_rotary_pos_emb", "eager_attention_forward"))
        return parts and functions and hasattr(model, "lm_head")

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: Mask,
        cache: CompactingCache,
        last_only: bool = False,
    ) -> torch.Tensor:
        hidden = self.embed(input_ids[None])
        rotations = [self._rotary(hidden, positions[None], kind) for kind in self.rotary_kinds]
        rows = slice(-1, None) if last_only else slice(None)
        if self.whole_step is not None:
            masks = [mask[kind] for kind in self.layer_types] if isinstance(mask, dict) else [mask]
            cos, sin = [r[0] for r in rotations], [r[1] for r in rotations]
            return self._logits(self.whole_step(hidden, cos, sin, masks, cache)[:, rows])
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            layer_mask = mask[self.layer_types[index]] if isinstance(mask, dict) else mask
            cos, sin = rotations[self.rotary_index[index]]
            states = layer.input_layernorm(hidden)
            if isinstance(attention, WholeAttention):
                output, _ = attention(states, position_embeddings=(cos, sin), attention_mask=layer_mask, cache=cache)
            else:
                output = self._attention(attention, index, states, cos, sin, layer_mask, cache)
            if self.sandwich:
                hidden = hidden + layer.post_attention_layernorm(output)
                mlp = self._mlp(layer.mlp, layer.pre_feedforward_layernorm(hidden))
                hidden = hidden + layer.post_feedforward_layernorm(mlp)
            else:
                hidden = hidden + output
                hidden = hidden + self._mlp(layer.mlp, layer.post_attention_layernorm(hidden))
        return self._logits(self.norm(hidden[:, rows]))

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor, kind: str | None):
        return self.rotary(hidden, positions) if kind is None else self.rotary(hidden, positions, kind)

    def _logits(self, states: torch.Tensor) -> torch.Tensor:
        """The head over the final norm's output, soft-capped as the model's forward does (Gemma 2)."""
        logits = self.head(states)
        if self.logit_cap is not None:
            logits = logits / self.logit_cap
            logits = torch.tanh(logits)
            logits = logits * self.logit_cap
        return logits[0]

    def _attention(
        self,
        attention: torch.nn.Module,
        index: int,
        states: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: CompactingCache,
    ) -> torch.Tensor:
        """The model's attention module computed as it does (its o_proj included), q/k/v as one
        matmul where a fused layer is kept (or the checkpoint has one: Phi-3's qkv_proj)."""
        count = states.shape[1]
        head_dim = attention.head_dim
        shape = (1, count, -1, head_dim)
        fused = getattr(attention, FUSED_QKV, None) or getattr(attention, "qkv_proj", None)
        if fused is not None:  # one matmul for q, k and v (models/weights.py keeps it)
            sizes = (self.heads * head_dim, self.kv_heads * head_dim, self.kv_heads * head_dim)
            query, key, value = fused(states).split(sizes, dim=-1)
        else:
            query, key, value = attention.q_proj(states), attention.k_proj(states), attention.v_proj(states)
        query, key = query.view(shape), key.view(shape)
        q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
        if q_norm is not None and not self.norm_after_transpose:
            query, key = q_norm(query), k_norm(key)
        query, key = query.transpose(1, 2), key.transpose(1, 2)
        if q_norm is not None and self.norm_after_transpose:
            query, key = q_norm(query), k_norm(key)
        value = value.view(shape).transpose(1, 2)
        query, key = self.apply_rotary(query, key, cos, sin)
        key, value = cache.update(key, value, index)
        extra = {"softcap": attention.attn_logit_softcapping} if hasattr(attention, "attn_logit_softcapping") else {}
        plain = extra.get("softcap") is None
        if plain and count > 1 and self.attention is sdpa_attention_forward and shares_kv_heads(query, key, mask):
            output = grouped_sdpa(query, key, value, mask, attention.scaling)
        else:
            output, _ = self.attention(
                attention, query, key, value, mask, dropout=0.0, scaling=attention.scaling, **extra
            )
        return attention.o_proj(output.reshape(1, count, -1).contiguous())

    @staticmethod
    def _mlp(mlp: torch.nn.Module, states: torch.Tensor) -> torch.Tensor:
        """The MLP as the model computes it: down(act(gate(x)) * up(x)), gate and up in one matmul
        where a fused layer is kept."""
        fused = getattr(mlp, FUSED_GATE_UP, None)
        if fused is None:
            return mlp(states)
        gate, up = fused(states).split([mlp.gate_proj.out_features, mlp.up_proj.out_features], dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)


def shares_kv_heads(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Grouped-query attention (more query heads than key/value heads) under one mask for all heads."""
    return (
        query.shape[1] > key.shape[1]
        and query.shape[1] % key.shape[1] == 0
        and isinstance(mask, torch.Tensor)
        and mask.dim() == 4
        and mask.shape[:2] == (1, 1)
    )


def grouped_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float
) -> torch.Tensor:
    """transformers' SDPA attention for several tokens, without copying the cache per query head.

    Its `repeat_kv` copies every key/value head once per query head sharing it (3x the cache on
    SmolLM2, each layer, each step). Here each key/value head is a batch entry whose query heads
    read it through a stride-0 view, so SDPA computes every (head, row) with the same blocking and
    sums as in transformers' layout (tests compare bit for bit, float32 and bfloat16): ~140 -> ~90 us
    per layer for a 3-token bfloat16 step over 300 cached tokens on SmolLM2's 9/3 heads. Returns
    (1, tokens, heads, head_dim), as the model's attention function does."""
    _, heads, count, head_dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    shape = (kv_heads, groups, length, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(kv_heads, groups, count, head_dim),
        key.transpose(0, 1).expand(shape),
        value.transpose(0, 1).expand(shape),
        attn_mask=mask,
        scale=scaling,
    )
    return out.reshape(1, heads, count, head_dim).transpose(1, 2).contiguous()


def make_forward(model: torch.nn.Module, cache_keyword: str) -> ModelForward | LlamaFamilyForward:
    """The direct path where the model supports it, else the model's own forward."""
    return LlamaFamilyForward(model) if LlamaFamilyForward.supports(model) else ModelForward(model, cache_keyword)
