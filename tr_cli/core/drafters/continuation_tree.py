"""Several earlier continuations of the same context, folded into one small tree of drafts.

A lookup (in this conversation or in the recycled store) finds the places where the context's
tail occurred before; what followed each of them is one continuation. Continuations that agree
share nodes, so the tree branches where they disagree: its first level holds distinct first
tokens, and each node counts how many continuations pass through it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Continuation:
    match: int  # how many context tokens matched before it (longer: more trustworthy)
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class ContinuationTree:
    """Nodes 1..n under a root (index 0): node i holds `tokens[i]` after node `parents[i]`."""

    parents: tuple[int, ...]  # parents[0] = -1
    tokens: tuple[int, ...]  # tokens[0] is unused (the root's token is the decoder's)
    share: tuple[float, ...]  # of the continuations through the parent, the share through this node
    match: tuple[int, ...]  # the longest match among the continuations through this node
    depths: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.parents) - 1


def fold(continuations: list[Continuation], max_nodes: int) -> ContinuationTree:
    """The continuations as one tree, keeping the `max_nodes` nodes most continuations share
    (ties: shallower, then earlier first, so longer matches, listed first, win)."""
    children: list[dict[int, int]] = [{}]
    parents, tokens, counts, match, depths = [-1], [0], [len(continuations)], [0], [0]
    for cont in continuations:
        node = 0
        for token in cont.tokens:
            child = children[node].get(token)
            if child is None:
                child = children[node][token] = len(parents)
                children.append({})
                parents.append(node)
                tokens.append(token)
                counts.append(0)
                match.append(cont.match)
                depths.append(depths[node] + 1)
            counts[child] += 1
            node = child
    # A child never has more continuations than its parent, so the best-ranked nodes form a tree.
    ranked = sorted(range(1, len(parents)), key=lambda i: (-counts[i], depths[i], i))[:max_nodes]
    keep = sorted(ranked)  # creation order puts every parent before its children
    index = {0: 0}
    out_parents, out_tokens, out_share, out_match, out_depths = [-1], [0], [1.0], [0], [0]
    for i in keep:
        index[i] = len(out_parents)
        out_parents.append(index[parents[i]])
        out_tokens.append(tokens[i])
        out_share.append(counts[i] / counts[parents[i]])
        out_match.append(match[i])
        out_depths.append(depths[i])
    return ContinuationTree(
        tuple(out_parents), tuple(out_tokens), tuple(out_share), tuple(out_match), tuple(out_depths)
    )
