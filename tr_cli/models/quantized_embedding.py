"""A token embedding kept as tr's kernels hold weights (a Q4Linear's or Q8Linear's buffers): each
looked-up row dequantized when it is asked for, so a GGUF's quantized embedding never becomes a
float matrix (SmolLM2's is 113 MB in float32, a 150k-vocabulary 0.5B's 545 MB). A tied output head
is the layer over the very same buffers (no second copy). A scaled embedding (Gemma's multiplies
its rows by sqrt(hidden)) is the same rows times its `scale`."""

from __future__ import annotations

import torch
from torch import nn

from .weights import NATIVE_COLUMNS, _NativeLinear


class QuantizedEmbedding(nn.Module):
    """nn.Embedding's forward (ids -> float32 rows) over `layer`'s buffers, its output column t being
    token t's row (the head's layout: levels (vocab / 8, groups, 8 columns x 32 inputs)), times
    `scale` where given."""

    def __init__(self, layer: _NativeLinear, padding_idx: int | None = None, scale: torch.Tensor | None = None) -> None:
        super().__init__()
        if layer.mode not in ("int4", "int8"):  # the kinds forward unpacks (int5's fifth bits it would misread)
            raise ValueError(f"a quantized embedding takes int4 or int8 weights, not {layer.mode}")
        self.num_embeddings = layer.out_features
        self.embedding_dim = layer.in_features
        self.padding_idx = padding_idx
        self.int4 = layer.mode == "int4"
        self.register_buffer("levels", layer.levels)
        self.register_buffer("steps", layer.steps)
        self.register_buffer("minimums", layer.minimums if self.int4 else None)
        self.register_buffer("scale", scale, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """What callers read an embedding's device and dtype from (the values are the rows `forward`
        gives; this is their per-group steps)."""
        return self.steps

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1).long()
        blocks, columns = ids // NATIVE_COLUMNS, ids % NATIVE_COLUMNS
        levels = self.levels[blocks]  # (n, groups, 8 vectors x 8 columns x 4 inputs [/ 2 for int4])
        n, groups = levels.shape[:2]
        if self.int4:
            nibbles = levels.reshape(n, groups, 4, NATIVE_COLUMNS, 4)
            vectors = torch.cat([nibbles & 15, nibbles >> 4], dim=2)  # (n, groups, 8 vectors, 8, 4)
        else:
            vectors = levels.reshape(n, groups, 8, NATIVE_COLUMNS, 4)
        picked = vectors[torch.arange(n), :, :, columns]  # (n, groups, 8 vectors, 4): inputs in order
        values = picked.reshape(n, groups, -1).float()
        steps = self.steps[blocks, :, columns].float()[..., None]
        rows = values * steps
        if self.int4:
            rows = rows + self.minimums[blocks, :, columns].float()[..., None]
        if self.scale is not None:
            rows = rows.reshape(n, -1) * self.scale
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        kind = "int4" if self.int4 else "int8"
        scaled = f", scale={float(self.scale):g}" if self.scale is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}, weights={kind}{scaled}"
