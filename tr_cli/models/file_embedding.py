"""An untied token embedding read where it lies in the GGUF file: the file's rows mapped read-only,
each looked-up row dequantized from its own blocks (gguf's `dequantize`) when it is asked for.

A step looks up a few dozen ids, a prompt a few thousand, out of a 150k-token vocabulary: only
their pages are ever read, and they are the file's pages (the OS's page cache), not the process's
memory. Kept as tr's int8 levels instead, a 0.5B Qwen2's Q5_0 embedding took 145 MB of its own
(a third of the 1.4 GB peak). A tied embedding stays the head's buffers (quantized_embedding.py):
the head reads every row at every step anyway. Like llama.cpp's, the mapping expects the file to
stay as it is while tr runs (a file cut short under a running process is a bus error in both).
A scaled embedding (Gemma's multiplies its rows by sqrt(hidden)) is the same rows times its `scale`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from .gguf_blocks import dequantized
from .gguf_header import TensorInfo


class FileEmbedding(nn.Module):
    """nn.Embedding's forward (ids -> float32 rows) over tensor `tensor` of the GGUF at `path`, times
    `scale` where given."""

    def __init__(
        self,
        path: Path,
        data_start: int,
        tensor: TensorInfo,
        padding_idx: int | None = None,
        scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.embedding_dim = tensor.dims[0]
        self.num_embeddings = tensor.n_elements // self.embedding_dim
        self.padding_idx = padding_idx
        self.ggml_type = tensor.ggml_type
        row_bytes = tensor.nbytes // self.num_embeddings
        self._rows = np.memmap(
            path, dtype=np.uint8, mode="r", offset=data_start + tensor.offset, shape=(self.num_embeddings, row_bytes)
        )
        # What callers read an embedding's device and dtype from (no values: they are in the file).
        self.register_buffer("weight", torch.empty(0), persistent=False)
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1).long()
        if not ids.numel():
            return torch.empty(*input_ids.shape, self.embedding_dim, device=self.weight.device)
        if not (0 <= int(ids.min()) and int(ids.max()) < self.num_embeddings):
            raise IndexError(f"token ids out of range for an embedding of {self.num_embeddings} rows")
        raw = torch.from_numpy(self._rows[ids.cpu().numpy()])  # a copy of just those rows' bytes
        rows = dequantized(self.ggml_type, raw, raw.shape[0], self.embedding_dim)
        if self.scale is not None:
            rows = rows * self.scale
        return rows.reshape(*input_ids.shape, self.embedding_dim).to(self.weight.device)

    def extra_repr(self) -> str:
        from .gguf_blocks import type_name

        return f"{self.num_embeddings}, {self.embedding_dim}, read from the file ({type_name(self.ggml_type)})"
