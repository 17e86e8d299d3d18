"""Tensors derived from a tree spec once and reused every step: what verification, masks and
drafting read (ancestor mask, depths, leaf paths, the matrix levels)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import TreeSpec


@dataclass(frozen=True, eq=False)
class TreeBuffers:
    """Tensors derived from a spec once and reused every step (Medusa-style buffers). Compared
    and hashed by identity: each is built once per spec and cached by whoever drafts with it."""

    spec: TreeSpec
    depths: torch.Tensor  # (n+1,) long: position offset of each node from the root
    parents: torch.Tensor  # (n+1,) long: parent node index, root points to itself
    slots: torch.Tensor  # (n+1,) long
    ancestor_mask: torch.Tensor  # (n+1, n+1) bool: [i, j] = j is i or an ancestor of i
    # Per depth: (parents, slots, start, end) of its matrix nodes, sliced once: drafting gathers a
    # level per step and slicing costs as much as the gather on a tree this small.
    level_gathers: tuple[tuple[torch.Tensor, torch.Tensor, int, int], ...]
    leaf_paths: torch.Tensor  # (leaves, D) long: root-to-leaf node indices, padded with n+1
    matrix_nodes: torch.Tensor  # (m,) long: indices of the matrix draft nodes

    @classmethod
    def build(cls, spec: TreeSpec, device: torch.device | str = "cpu") -> TreeBuffers:
        n1 = spec.size + 1
        parents = [0] + list(spec.parents[1:])
        # Root-to-node chains from the parent's chain (parents come first): planned trees change
        # every step, so this runs per step and stays in plain lists until one tensor fill.
        chains: list[list[int]] = [[]]
        for i in range(1, n1):
            chains.append(chains[parents[i]] + [i])
        rows = [i for i in range(n1) for _ in range(len(chains[i]) + 1)]
        cols = [j for i in range(n1) for j in (0, *chains[i])]
        anc = torch.zeros(n1, n1, dtype=torch.bool)
        anc[rows, cols] = True
        depths = spec.depths
        m1 = n1 - spec.external_size
        levels = []
        start = 1
        while start < m1:
            end = start
            while end < m1 and depths[end] == depths[start]:
                end += 1
            levels.append((start, end))
            start = end
        has_child = set(parents[1:])
        pad = n1  # an index past the end, whose "correct" flag is always False
        leaves = [i for i in range(1, n1) if i not in has_child]
        rows = [chains[leaf] + [pad] * (spec.depth - len(chains[leaf])) for leaf in leaves]
        leaf_paths = (
            torch.tensor(rows, dtype=torch.long).reshape(len(rows), spec.depth)
            if rows
            else torch.zeros(0, 0, dtype=torch.long)
        )
        parents_t = torch.tensor(parents, dtype=torch.long, device=device)
        slots_t = torch.tensor(spec.slots, dtype=torch.long, device=device)
        return cls(
            spec=spec,
            depths=torch.tensor(depths, dtype=torch.long, device=device),
            parents=parents_t,
            slots=slots_t,
            ancestor_mask=anc.to(device),
            level_gathers=tuple(
                (parents_t[start:end].clone(), slots_t[start:end].clone(), start, end) for start, end in levels
            ),
            leaf_paths=leaf_paths.to(device),
            matrix_nodes=torch.arange(1, m1, dtype=torch.long, device=device),
        )

    def right_paths(self, correct: torch.Tensor) -> list[bool]:
        """Per node, whether it and all its ancestors are right (the root is), on the host, from
        `correct` (node i equals its parent's choice)."""
        wrong = ~correct
        wrong[0] = False
        return (~(self.ancestor_mask & wrong[None, :]).any(dim=1)).tolist()

    @property
    def level_slices(self) -> tuple[tuple[int, int], ...]:
        """Matrix node index ranges [start, end), one per depth."""
        return tuple((start, end) for _, _, start, end in self.level_gathers)

    @property
    def size(self) -> int:
        """Tokens per verification forward: root + draft nodes."""
        return self.spec.size + 1

    @property
    def depth(self) -> int:
        return self.spec.depth
