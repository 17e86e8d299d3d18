"""The adjacency matrix: row t holds the k latest candidate tokens that followed token t."""

from __future__ import annotations

import torch

from .matrix_width import DEFAULT_K


def output_vocab_size(model: torch.nn.Module) -> int:
    """Matrix rows: the output embedding's rows (the logits' size), which may exceed len(tokenizer)."""
    out = model.get_output_embeddings()
    if out is not None and hasattr(out, "weight"):
        return int(out.weight.shape[0])
    if isinstance(getattr(out, "out_features", None), int):  # a quantized head keeps no dense weight
        return out.out_features
    return int(model.config.get_text_config(decoder=True).vocab_size)


def new_matrix(vocab_size: int, k: int = DEFAULT_K, device: torch.device | str = "cpu") -> torch.Tensor:
    """An empty (all-zero) |V|×k matrix. int32 holds any real vocabulary and indexes directly."""
    if vocab_size <= 0 or k <= 0:
        raise ValueError(f"matrix shape must be positive, got vocab_size={vocab_size}, k={k}")
    return torch.zeros(vocab_size, k, dtype=torch.int32, device=device)


def update_rows(matrix: torch.Tensor, tokens: torch.Tensor, candidates: torch.Tensor) -> None:
    """Overwrite row tokens[i] with candidates[i]. With repeated tokens any one write wins: all are
    fresh candidates for that token, so no conflict resolution is needed."""
    rows = tokens.to(device=matrix.device, dtype=torch.long)
    matrix.index_copy_(0, rows, candidates.to(device=matrix.device, dtype=matrix.dtype))


def filled_rows(matrix: torch.Tensor) -> torch.Tensor:
    """(V,) bool: rows holding any candidate (an empty row is all zeros)."""
    return matrix.any(dim=1)


def rows_filled(matrix: torch.Tensor) -> int:
    """How many rows hold any candidate."""
    return int(filled_rows(matrix).sum())
