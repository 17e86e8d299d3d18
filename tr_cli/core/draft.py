"""Draft retrieval: walk the matrix from the root token along the tree spec, one gather per level."""

from __future__ import annotations

import torch

from .tree import TreeBuffers


def draft_tree(
    matrix: torch.Tensor,
    root_token: int | torch.Tensor,
    buffers: TreeBuffers,
    lookup: list[int] | None = None,
) -> torch.Tensor:
    """Tokens for every tree node, (n+1,) long, node 0 = root_token.

    Node i gets matrix[token(parent(i)), slot(i)]. Level d only depends on level d-1, so each level
    is a single vectorized gather; the loop runs over depths (about 6), never over nodes.
    A lookup chain takes the `lookup` tokens; when they are fewer than its nodes, the chain goes on
    along the matrix's first candidates (a guess that costs nothing extra to verify).
    """
    tokens = torch.empty(buffers.size, dtype=torch.long, device=matrix.device)
    tokens[0] = root_token
    parents, slots = buffers.parents, buffers.slots
    for start, end in buffers.level_slices:
        tokens[start:end] = matrix[tokens[parents[start:end]], slots[start:end]]
    start, end = buffers.lookup_slice
    if end > start:
        given = list(lookup or [])[: end - start]
        if given:
            tokens[start : start + len(given)] = torch.tensor(given, dtype=torch.long).to(matrix.device)
        for i in range(start + len(given), end):
            tokens[i] = matrix[tokens[i - 1 if i > start else 0], 0]
    return tokens
