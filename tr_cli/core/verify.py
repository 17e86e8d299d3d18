"""Greedy verification of a draft tree against the model's outputs at every node."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import TreeBuffers


@dataclass(frozen=True)
class Acceptance:
    """Outcome of one verification: accepted draft nodes (root-to-leaf order) and the bonus token."""

    nodes: list[int]  # tree node indices, excluding the root
    tokens: list[int]  # their tokens
    bonus: int  # the model's next token after the accepted path

    @property
    def emitted(self) -> list[int]:
        return self.tokens + [self.bonus]


def greedy_accept(tree_tokens: torch.Tensor, logits: torch.Tensor, buffers: TreeBuffers) -> Acceptance:
    """Longest root-to-node path whose every token equals its parent's argmax.

    tree_tokens: (n+1,), logits: (n+1, V). All comparison work stays on the device; one small
    transfer at the end is the step's only host sync.
    """
    predicted = logits.argmax(dim=-1)  # (n+1,) the model's greedy choice after each node
    correct = tree_tokens == predicted[buffers.parents]
    correct[0] = True
    # Index n+1 pads short leaf paths and is never correct.
    correct = torch.cat([correct, correct.new_zeros(1)])
    on_path = correct[buffers.leaf_paths].to(torch.int8)  # (leaves, D)
    accepted_len = on_path.cumprod(dim=1).sum(dim=1)
    best = accepted_len.argmax()
    length = accepted_len[best]
    path = buffers.leaf_paths[best]
    last_node = torch.where(length > 0, path[(length - 1).clamp(min=0)], path.new_zeros(()))
    packed = torch.cat([length.view(1), path, tree_tokens[path.clamp(max=buffers.size - 1)], predicted[last_node].view(1)])
    values = packed.tolist()
    depth = buffers.spec.depth
    n = values[0]
    nodes = values[1 : 1 + n]
    tokens = values[1 + depth : 1 + depth + n]
    return Acceptance(nodes=nodes, tokens=tokens, bonus=values[-1])
