"""Build a matrix from text: prefill the model over it, each position's top-k into its token's row."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .decode import PREFILL_CHUNK
from .forward import takes_batches
from .matrix import update_rows
from .verify import TopCandidates

BATCH_TOKENS = 2048  # positions per forward (bounds the logits' memory)


@torch.inference_mode()
def fill_from_token_lists(
    model: torch.nn.Module,
    matrix: torch.Tensor,
    token_lists: list[list[int]],
    progress: Callable[[int], None] | None = None,
) -> int:
    """Prefill every list (cut into chunks, batched by length where the model `takes_batches`,
    one at a time where it does not) and write the top-k rows.

    Right padding is harmless under a causal mask: real positions never see the pad after them,
    and the padded positions' outputs are not used. Returns the number of positions written.
    """
    device = matrix.device
    k = matrix.shape[1]
    batch_tokens = BATCH_TOKENS if takes_batches(model) else 0
    chunks = [ids[i : i + PREFILL_CHUNK] for ids in token_lists for i in range(0, len(ids), PREFILL_CHUNK)]
    chunks = [c for c in chunks if c]
    chunks.sort(key=len, reverse=True)
    written = 0
    i = 0
    while i < len(chunks):
        width = len(chunks[i])
        batch = chunks[i : i + max(1, batch_tokens // width)]
        i += len(batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long, device=device)
        for row, chunk in enumerate(batch):
            ids[row, : len(chunk)] = torch.tensor(chunk, device=device)
        logits = model(input_ids=ids, use_cache=False).logits.to(device)
        for row, chunk in enumerate(batch):
            n = len(chunk)
            update_rows(matrix, ids[row, :n], TopCandidates.of(logits[row, :n], k).indices)
            written += n
            if progress:
                progress(n)
    return written
