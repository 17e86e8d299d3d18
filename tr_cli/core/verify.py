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
    # (n+1,) bool on the device: node equals its parent's choice. Nodes under a wrong one may read
    # either way (a walk never looks at them): learners only count nodes whose path is right.
    correct: torch.Tensor | None = None
    right_paths: list[bool] | None = None  # per node, its whole path is right: where found on the host


# A model may carry a faster top-k of its logits under this attribute (models/ attaches tr's kernel):
# `select(logits (rows, V), k) -> (values, indices)`, best first, equal values by smaller index and
# NaN above all, so that column 0 is exactly `argmax`.
ROW_TOPK = "tr_row_topk"
RowTopK = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class TopCandidates:
    """One top-k over every node's logits, shared by verification (argmax) and the matrix update."""

    values: torch.Tensor  # (n+1, k) best first
    indices: torch.Tensor  # (n+1, k) long
    first_is_argmax: bool = False  # ties ordered by index (a RowTopK's order): column 0 is the argmax

    @classmethod
    def of(cls, logits: torch.Tensor, k: int, select: RowTopK | None = None) -> TopCandidates:
        """torch.topk's, or `select`'s where given and it takes these logits (float32, 2-D)."""
        if select is not None and logits.dtype == torch.float32 and logits.dim() == 2:
            return cls(*select(logits, k), first_is_argmax=True)
        values, indices = torch.topk(logits, k, dim=-1, sorted=True)
        return cls(values, indices)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Exactly `logits.argmax(-1)` (first index among equal maxima), from the top-k.

        topk may order tied values arbitrarily, so among the entries equal to the maximum the
        smallest index wins. Only when all k entries tie (more ties may lie beyond k) does a row
        fall back to a full argmax; that costs a host check, which is free on the CPU.
        """
        if self.first_is_argmax:
            return self.indices[:, 0]
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
    was computed already. On an accelerator all comparison work stays on the device and one small
    transfer at the end is the step's only host sync; on the CPU it is a walk over lists.
    """
    if predicted is None:
        predicted = logits.argmax(dim=-1)  # (n+1,) the model's greedy choice after each node
    if buffers.size == 1:  # nothing drafted: plain decoding
        return Acceptance(nodes=[], tokens=[], bonus=int(predicted[0]), correct=predicted.new_ones(1, dtype=torch.bool))
    if tree_tokens.device.type == "cpu":  # no transfer to save: a pass over lists beats ~15 small tensor ops
        return accept_on_host(tree_tokens.tolist(), predicted.tolist(), buffers)
    return accept_on_device(tree_tokens, predicted, buffers)


def accept_on_host(tokens: list[int], predicted: list[int], buffers: TreeBuffers) -> Acceptance:
    """greedy_accept over lists: one pass in node order (parents come first) marks the nodes whose
    whole path is right; the deepest of them, the first in node order among equals, ends the
    accepted path. `correct` is that mark (learners count only nodes whose path is right)."""
    parents, depths = buffers.spec.parents, buffers.spec.depths
    right = [True] + [False] * (len(tokens) - 1)
    last = 0
    for node in range(1, len(tokens)):
        parent = parents[node]
        if right[parent] and tokens[node] == predicted[parent]:
            right[node] = True
            if depths[node] > depths[last]:
                last = node
    nodes = []
    node = last
    while node:
        nodes.append(node)
        node = parents[node]
    nodes.reverse()
    correct = torch.tensor(right, dtype=torch.bool)
    return Acceptance(nodes, [tokens[i] for i in nodes], predicted[last], correct, right_paths=right)


def accept_on_device(tree_tokens: torch.Tensor, predicted: torch.Tensor, buffers: TreeBuffers) -> Acceptance:
    """greedy_accept's longest right path found with tensor ops on the device, one transfer at the end."""
    correct = tree_tokens == predicted[buffers.parents]
    correct[0] = True
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
