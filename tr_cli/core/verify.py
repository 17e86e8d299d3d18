"""Greedy verification of a draft tree against the model's outputs at every node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .constraint import TokenConstraint, masked_argmax
from .tree_buffers import TreeBuffers


@dataclass(frozen=True)
class Acceptance:
    """Outcome of one verification: accepted draft nodes (root-to-leaf order) and the bonus token."""

    nodes: list[int]  # tree node indices, excluding the root
    tokens: list[int]  # their tokens
    bonus: int  # the model's next token after the accepted path
    correct: torch.Tensor | None = None  # (n+1,) bool on the device: node equals its parent's choice


@dataclass(frozen=True)
class TopCandidates:
    """One top-k over every node's logits, shared by verification (argmax) and the matrix update."""

    values: torch.Tensor  # (n+1, k) best first
    indices: torch.Tensor  # (n+1, k) long

    @classmethod
    def of(cls, logits: torch.Tensor, k: int) -> TopCandidates:
        values, indices = torch.topk(logits, k, dim=-1, sorted=True)
        return cls(values, indices)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Exactly `logits.argmax(-1)` (first index among equal maxima), from the top-k.

        topk may order tied values arbitrarily, so among the entries equal to the maximum the
        smallest index wins. Only when all k entries tie (more ties may lie beyond k) does a row
        fall back to a full argmax; that costs a host check, which is free on the CPU.
        """
        best = self.values[:, :1]
        tied = self.values == best
        big = torch.iinfo(torch.long).max
        first = torch.where(tied, self.indices, torch.full_like(self.indices, big)).amin(dim=1)
        if self.values.shape[1] > 1:
            all_tied = tied[:, -1]
            if bool(all_tied.any()):
                first = torch.where(all_tied, logits.argmax(dim=-1), first)
        else:
            first = logits.argmax(dim=-1)
        return first


def greedy_accept(
    tree_tokens: torch.Tensor,
    logits: torch.Tensor,
    buffers: TreeBuffers,
    predicted: torch.Tensor | None = None,
) -> Acceptance:
    """Longest root-to-node path whose every token equals its parent's argmax.

    tree_tokens: (n+1,), logits: (n+1, V); `predicted` (the argmax per node) may be given when it
    was computed already. All comparison work stays on the device; one small transfer at the end is
    the step's only host sync.
    """
    if predicted is None:
        predicted = logits.argmax(dim=-1)  # (n+1,) the model's greedy choice after each node
    correct = tree_tokens == predicted[buffers.parents]
    correct[0] = True
    if buffers.size == 1:  # nothing drafted: plain decoding
        return Acceptance(nodes=[], tokens=[], bonus=int(predicted[0]), correct=correct)
    # Index n+1 pads short leaf paths and is never correct.
    padded = torch.cat([correct, correct.new_zeros(1)])
    on_path = padded[buffers.leaf_paths].to(torch.int8)  # (leaves, D)
    accepted_len = on_path.cumprod(dim=1).sum(dim=1)
    best = accepted_len.argmax()
    length = accepted_len[best]
    path = buffers.leaf_paths[best]
    last_node = torch.where(length > 0, path[(length - 1).clamp(min=0)], path.new_zeros(()))
    packed = torch.cat(
        [length.view(1), path, tree_tokens[path.clamp(max=buffers.size - 1)], predicted[last_node].view(1)]
    )
    values = packed.tolist()
    depth = buffers.depth
    n = values[0]
    nodes = values[1 : 1 + n]
    tokens = values[1 + depth : 1 + depth + n]
    return Acceptance(nodes=nodes, tokens=tokens, bonus=values[-1], correct=correct)


def walk_accept(
    tokens: list[int], buffers: TreeBuffers, device: torch.device, choose: Callable[[int, int], int]
) -> Acceptance:
    """Down from the root, one chosen token at a time: `choose(node, emitted)` gives the token that
    comes after `node` (the `emitted`-th of this step); a child holding it is accepted and the
    walk goes on from there, else that token is the bonus. Every chosen token is emitted, so a
    chooser may advance state (a grammar, a repetition penalty) by each one it returns.

    Duplicate siblings (e.g. a lookup chain repeating a matrix candidate) stand for the same token
    path, so they share one distribution: the walk keeps all of them and tries the children of
    each; the choice reads the first one's logits. Which duplicate carries the path on changes no
    token, only how deep the drafts reach. `correct` marks the nodes whose token is the one chosen
    after their parent (the root too); nodes under a mismatch are False, as the acceptance
    statistics never count them.
    """
    children = buffers.spec.children  # tried in node order
    frontier: list[tuple[int, tuple[int, ...]]] = [(0, ())]  # (node, its path from the root)
    accepted: list[int] = []
    right = [0]
    while True:
        y = choose(frontier[0][0], len(accepted))
        matched = [(c, path + (c,)) for node, path in frontier for c in children[node] if tokens[c] == y]
        if not matched:
            correct = torch.zeros(len(tokens), dtype=torch.bool)
            correct[right] = True
            return Acceptance(nodes=list(frontier[0][1]), tokens=accepted, bonus=y, correct=correct.to(device))
        accepted.append(y)
        right.extend(c for c, _ in matched)
        frontier = matched


def constrained_greedy_accept(
    tree_tokens: torch.Tensor,
    logits: torch.Tensor,
    buffers: TreeBuffers,
    top: TopCandidates,
    constraint: TokenConstraint,
) -> Acceptance:
    """greedy_accept under a grammar (core/constraint.py): the choice after each visited node is
    the best token the grammar allows there, and the grammar advances by every emitted token."""
    values, indices = top.values.tolist(), top.indices.tolist()

    def choose(node: int, _emitted: int) -> int:
        token = masked_argmax(logits[node], values[node], indices[node], constraint)
        constraint.advance(token)
        return token

    return walk_accept(tree_tokens.tolist(), buffers, logits.device, choose)
