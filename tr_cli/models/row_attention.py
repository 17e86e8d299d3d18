"""tr's row-exact attention (row_attention.cpp), for models on tr's int4/int8 kernels.

Those kernels round each row's activations to int8, which turns the tiny differences SDPA leaves
between one query and many (its blocking follows the number of queries) into different roundings,
and so into different logits (up to ~0.7 on SmolLM2): tr's tree steps would then part from
`generate`'s one-token steps at near-ties. This attention computes each (head, query) row alone,
keys in order, masked keys adding exact zeros, so a tree's rows equal one-token steps bit for bit.

It plugs in through transformers' public interfaces: the function under AttentionInterface, SDPA's
mask builder under AttentionMaskInterface, `model.set_attn_implementation`; `generate` and tr then
run the same attention. The direct path's families only (core/forward.py's DIRECT_FAMILIES: scaled
dot-product attention, soft-capped in Gemma 2; no sinks or position biases), float32.
"""

from __future__ import annotations

import torch

from ..core.forward import DIRECT_FAMILIES, ROW_ATTENTION
from .runtime import NATIVE_DTYPE

_registered = False


def row_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: (batch 1, heads, queries, dim) query, key/value
    heads unrepeated, a 4D mask (additive float or boolean) or None; returns (1, queries, heads,
    dim) and no weights. None with several queries means causal, keys cut to the queries, as
    transformers' SDPA path does. `softcap`: scores soft-capped as transformers' eager attention does."""
    if kwargs.get("s_aux") is not None:
        raise ValueError("tr's row attention takes scaled dot-product attention without sinks only")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    softcap = float(kwargs.get("softcap") or 0.0)
    return torch.ops.tr_kernels.row_attention(query, key, value, attention_mask, scale, causal, softcap), None


def supports(model: torch.nn.Module) -> bool:
    """A float32 decoder of the direct path's families with batch-1 attention this function computes
    exactly."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in DIRECT_FAMILIES:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return head_dim % 8 == 0 and head_dim <= 256 and next(model.parameters()).dtype == NATIVE_DTYPE


def use_row_attention(model: torch.nn.Module) -> bool:
    """Switch `model` to tr's row-exact attention where `supports` it (tr's kernels loaded);
    returns whether it did."""
    global _registered
    if not supports(model):
        return False
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ROW_ATTENTION, row_attention)
        AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)  # the masks SDPA gets: None, or boolean
        _registered = True
    model.set_attn_implementation(ROW_ATTENTION)
    return True
