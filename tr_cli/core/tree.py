"""Draft tree specs and the buffers derived from them once per spec.

A tree has a root (node 0, the last emitted token, not yet in the KV cache) and n draft nodes.
Node i > 0 has a parent p < i and a slot s: its token is candidate s in the matrix row of its
parent's token. Matrix nodes are stored level by level (BFS order), which lets drafting gather a
whole level at once and makes the verification input a plain sequence.

A tree may end with a lookup chain (slot LOOKUP): a single path under the root whose tokens come
from prompt lookup (the continuation of an earlier occurrence of the context's last n-gram)
instead of the matrix. It follows all matrix nodes, so the matrix levels stay contiguous.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

LOOKUP = -1  # slot of a lookup-chain node: its token comes from prompt lookup, not the matrix


@dataclass(frozen=True)
class TreeSpec:
    """Static tree shape: `parents[i]` and `slots[i]` for draft nodes i = 1..n (index 0 = root)."""

    name: str
    parents: tuple[int, ...]
    slots: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.slots):
            raise ValueError("tree spec: parents and slots differ in length")
        if len(self.parents) < 1:
            raise ValueError("tree spec: needs a root")
        if self.parents[0] != -1:
            raise ValueError("tree spec: node 0 is the root and has no parent (-1)")
        seen: set[tuple[int, int]] = set()
        prev_depth = 0
        depths = [0]
        in_chain = False
        for i in range(1, len(self.parents)):
            p, s = self.parents[i], self.slots[i]
            if not 0 <= p < i:
                raise ValueError(f"tree spec: node {i} has parent {p}; parents must come before children")
            depth = depths[p] + 1
            depths.append(depth)
            if s == LOOKUP:
                # The chain: after every matrix node, a single path hanging from the root.
                if p != (0 if not in_chain else i - 1):
                    raise ValueError(f"tree spec: lookup node {i} must continue the lookup chain from the root")
                in_chain = True
                continue
            if in_chain:
                raise ValueError(f"tree spec: matrix node {i} comes after the lookup chain")
            if s < 0:
                raise ValueError(f"tree spec: node {i} has negative slot {s}")
            if p > 0 and self.slots[p] == LOOKUP:
                raise ValueError(f"tree spec: matrix node {i} hangs under a lookup node")
            if (p, s) in seen:
                raise ValueError(f"tree spec: node {i} repeats slot {s} under parent {p}")
            seen.add((p, s))
            if depth < prev_depth:
                raise ValueError(f"tree spec: node {i} breaks level order (depth {depth} after {prev_depth})")
            prev_depth = depth

    @classmethod
    def from_paths(cls, name: str, paths: list[list[int]]) -> "TreeSpec":
        """Build from root-to-node slot paths, e.g. [[0], [1], [0, 0]] (Medusa-style choices)."""
        ordered = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
        index = {(): 0}
        parents, slots = [-1], [0]
        for path in ordered:
            if not path:
                continue
            if path[:-1] not in index:
                raise ValueError(f"tree spec {name}: path {list(path)} has no parent path {list(path[:-1])}")
            index[path] = len(parents)
            parents.append(index[path[:-1]])
            slots.append(path[-1])
        return cls(name, tuple(parents), tuple(slots))

    @classmethod
    def from_child_counts(cls, name: str, levels: list[list[int]]) -> "TreeSpec":
        """Build from child counts: levels[d][j] = children of the j-th node at depth d (slots 0..c-1)."""
        parents, slots = [-1], [0]
        frontier = [0]
        for counts in levels:
            if len(counts) != len(frontier):
                raise ValueError(f"tree spec {name}: level has {len(counts)} counts for {len(frontier)} nodes")
            nxt = []
            for parent, count in zip(frontier, counts):
                for slot in range(count):
                    nxt.append(len(parents))
                    parents.append(parent)
                    slots.append(slot)
            frontier = nxt
        return cls(name, tuple(parents), tuple(slots))

    @classmethod
    def from_file(cls, path: Path) -> "TreeSpec":
        """Read a JSON spec: {"name": ..., "paths": [[0], [1], [0, 0], ...]}."""
        try:
            data = json.loads(Path(path).read_text())
            paths = data["paths"] if isinstance(data, dict) else data
            name = data.get("name", Path(path).stem) if isinstance(data, dict) else Path(path).stem
            spec = cls.from_paths(name, [list(map(int, p)) for p in paths])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a tree spec ({exc}); expected JSON {{\"paths\": [[0], [1], [0, 0]]}}") from exc
        if spec.size == 0:
            raise ValueError(f"{path}: the tree has no draft nodes; for plain decoding use --tree none")
        return spec

    @property
    def size(self) -> int:
        """Number of draft nodes (excluding the root)."""
        return len(self.parents) - 1

    @property
    def lookup_length(self) -> int:
        """Nodes in the lookup chain (0 when the tree has none)."""
        return self.slots.count(LOOKUP)

    @property
    def matrix_size(self) -> int:
        """Draft nodes that come from the matrix."""
        return self.size - self.lookup_length

    def with_lookup(self, length: int) -> "TreeSpec":
        """This tree plus a lookup chain of `length` nodes under the root."""
        if self.lookup_length:
            raise ValueError(f"tree spec {self.name} already has a lookup chain")
        if length <= 0:
            return self
        first = len(self.parents)
        parents = self.parents + (0,) + tuple(range(first, first + length - 1))
        return TreeSpec(f"{self.name}+lookup{length}", parents, self.slots + (LOOKUP,) * length)

    def without_lookup(self) -> "TreeSpec":
        """The matrix part of the tree."""
        n = len(self.parents) - self.lookup_length
        name = self.name.rsplit("+lookup", 1)[0]
        return TreeSpec(name, self.parents[:n], self.slots[:n]) if self.lookup_length else self

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depths = [0]
        for p in self.parents[1:]:
            depths.append(depths[p] + 1)
        return tuple(depths)

    @property
    def depth(self) -> int:
        return max(self.depths)

    @property
    def max_slot(self) -> int:
        return max(self.slots[1:], default=-1)

    def widths(self) -> list[int]:
        """Nodes per depth 1..D."""
        return [self.depths.count(d) for d in range(1, self.depth + 1)]

    def paths(self) -> list[list[int]]:
        """Root-to-node slot paths of the matrix nodes, the inverse of from_paths."""
        out: list[list[int]] = [[]]
        for i in range(1, len(self.parents) - self.lookup_length):
            out.append(out[self.parents[i]] + [self.slots[i]])
        return out[1:]


# The paper's tree (Token Recycling, "2.2.2"): 80 nodes, widths 8/21/25/15/8/3. Written as child
# counts per level; earlier (likelier) candidates get more children.
_PAPER_LEVELS = [
    [8],
    [8, 4, 3, 2, 1, 1, 1, 1],
    [8, 3, 2, 1, 1, 1, 1, 1, 2, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0],
    [5, 2, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0],
    [3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0],
    [2, 0, 0, 1, 0, 0, 0, 0],
]

PRESETS: dict[str, TreeSpec] = {
    "paper": TreeSpec.from_child_counts("paper", _PAPER_LEVELS),
    # No draft at all: one token per forward on tr's own forward path (the `ar` reference).
    "none": TreeSpec("none", (-1,), (0,)),
}


def resolve_tree(name_or_path: str) -> TreeSpec:
    """A preset name or a JSON spec file."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ValueError(f"--tree {name_or_path}: no such file; use a preset ({', '.join(PRESETS)}) or a JSON spec")
        return TreeSpec.from_file(path)
    raise ValueError(f"--tree {name_or_path}: unknown tree; use a preset ({', '.join(PRESETS)}) or a JSON spec file")


@dataclass(frozen=True)
class TreeBuffers:
    """Tensors derived from a spec once and reused every step (Medusa-style buffers)."""

    spec: TreeSpec
    depths: torch.Tensor  # (n+1,) long: position offset of each node from the root
    parents: torch.Tensor  # (n+1,) long: parent node index, root points to itself
    slots: torch.Tensor  # (n+1,) long
    ancestor_mask: torch.Tensor  # (n+1, n+1) bool: [i, j] = j is i or an ancestor of i
    level_slices: tuple[tuple[int, int], ...]  # matrix node index ranges [start, end) per depth
    leaf_paths: torch.Tensor  # (leaves, D) long: root-to-leaf node indices, padded with n+1
    lookup_slice: tuple[int, int]  # node index range of the lookup chain (empty when none)
    matrix_nodes: torch.Tensor  # (m,) long: indices of the matrix draft nodes

    @classmethod
    def build(cls, spec: TreeSpec, device: torch.device | str = "cpu") -> "TreeBuffers":
        n1 = spec.size + 1
        parents = [0] + list(spec.parents[1:])
        anc = torch.zeros(n1, n1, dtype=torch.bool)
        for i in range(n1):
            j = i
            anc[i, j] = True
            while j != 0:
                j = parents[j]
                anc[i, j] = True
        depths = spec.depths
        m1 = n1 - spec.lookup_length
        levels = []
        for d in range(1, spec.depth + 1):
            idx = [i for i in range(1, m1) if depths[i] == d]
            if idx:
                levels.append((idx[0], idx[-1] + 1))
        has_child = set(parents[1:])
        leaves = [i for i in range(1, n1) if i not in has_child]
        pad = n1  # an index past the end, whose "correct" flag is always False
        rows = []
        for leaf in leaves:
            chain = []
            j = leaf
            while j != 0:
                chain.append(j)
                j = parents[j]
            chain.reverse()
            rows.append(chain + [pad] * (spec.depth - len(chain)))
        leaf_paths = torch.tensor(rows, dtype=torch.long).reshape(len(rows), spec.depth) if rows else torch.zeros(0, 0, dtype=torch.long)
        return cls(
            spec=spec,
            depths=torch.tensor(depths, dtype=torch.long, device=device),
            parents=torch.tensor(parents, dtype=torch.long, device=device),
            slots=torch.tensor(spec.slots, dtype=torch.long, device=device),
            ancestor_mask=anc.to(device),
            level_slices=tuple(levels),
            leaf_paths=leaf_paths.to(device),
            lookup_slice=(m1, n1),
            matrix_nodes=torch.arange(1, m1, dtype=torch.long, device=device),
        )

    @property
    def size(self) -> int:
        """Tokens per verification forward: root + draft nodes."""
        return self.spec.size + 1

    @property
    def depth(self) -> int:
        return self.spec.depth
