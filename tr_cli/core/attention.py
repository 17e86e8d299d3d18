"""Custom 4D attention masks for prefill and tree verification, per attention layer type.

A 4D mask handed to a transformers model is used as given, so sliding-window layers need the
window applied in the mask itself. Models that mix full and sliding layers take a dict keyed by
layer type; models with a single type take one tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UnsupportedAttention

FULL = "full_attention"
SLIDING = "sliding_attention"
SUPPORTED_LAYER_TYPES = (FULL, SLIDING)


@dataclass(frozen=True)
class AttentionLayout:
    layer_types: tuple[str, ...]  # distinct types, in first-seen order
    sliding_window: int | None
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def from_config(cls, config, dtype: torch.dtype, device: torch.device | str) -> AttentionLayout:
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        window = getattr(text, "sliding_window", None)
        types = getattr(text, "layer_types", None)
        if types is None:
            if getattr(text, "attention_chunk_size", None) is not None:
                types = ["chunked_attention"]
            else:
                types = [SLIDING if window is not None else FULL]
        distinct = tuple(dict.fromkeys(types))
        unknown = [t for t in distinct if t not in SUPPORTED_LAYER_TYPES]
        if unknown:
            raise UnsupportedAttention(
                f"attention layer type(s) {', '.join(unknown)} are not supported "
                f"(only {', '.join(SUPPORTED_LAYER_TYPES)})"
            )
        if SLIDING in distinct and not window:
            raise UnsupportedAttention("sliding-window layers without a sliding_window size in the config")
        return cls(distinct, int(window) if SLIDING in distinct else None, dtype, torch.device(device))

    def build(
        self, past_len: int, positions: torch.Tensor, visible: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Mask for q new tokens over past_len cached ones.

        positions: (q,) absolute positions of the new tokens; cached token j sits at position j.
        visible: (q, q) bool, which new tokens each new token may see (causal or tree ancestors).
        Returns an additive float mask (1, 1, q, past_len + q), or a dict of them per layer type.
        """
        q = positions.shape[0]
        masks = {}
        for layer_type in self.layer_types:
            if layer_type == SLIDING:
                allowed = torch.ones(q, past_len + q, dtype=torch.bool, device=self.device)
                allowed[:, past_len:] = visible
                key_pos = torch.cat([torch.arange(past_len, device=self.device), positions])
                # Same rule as transformers' sliding overlay: key > query - window.
                allowed &= key_pos[None, :] > positions[:, None] - self.sliding_window
                masks[layer_type] = _additive(allowed, self.dtype)
            else:
                # Every cached token is visible: only the block of the new tokens is masked (this
                # runs every step, so no pass over the whole width but the one that zeroes it).
                mask = torch.zeros(1, 1, q, past_len + q, dtype=self.dtype, device=self.device)
                mask[0, 0, :, past_len:].masked_fill_(~visible, torch.finfo(self.dtype).min)
                masks[layer_type] = mask
        if len(masks) == 1:
            return next(iter(masks.values()))
        return masks


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def causal_visibility(q: int, device: torch.device | str) -> torch.Tensor:
    return torch.ones(q, q, dtype=torch.bool, device=device).tril_()
