"""Draft tree specs: shapes as data, the presets, JSON spec files, and merging drafters' trees.

A tree has a root (node 0, the last emitted token, not yet in the KV cache) and n draft nodes.
Node i > 0 has a parent p < i and a slot s: its token is candidate s in the matrix row of its
parent's token. Matrix nodes are stored level by level (BFS order), which lets drafting gather a
whole level at once and makes the verification input a plain sequence.

Nodes whose tokens come from another drafter (a prompt-lookup chain, say) have the slot EXTERNAL.
They follow all matrix nodes, so the matrix levels stay contiguous, and no matrix node hangs
under them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .errors import InvalidTree

# Bounds on a tree file: every node is verified in one forward pass, so thousands are never useful.
MAX_TREE_FILE_BYTES = 1 << 20
MAX_TREE_NODES = 512
MAX_TREE_DEPTH = 64
EXTERNAL = -1  # slot of a node whose token comes from another drafter than the matrix


@dataclass(frozen=True)
class TreeSpec:
    """Static tree shape: `parents[i]` and `slots[i]` for draft nodes i = 1..n (index 0 = root)."""

    name: str
    parents: tuple[int, ...]
    slots: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.slots):
            raise InvalidTree("tree spec: parents and slots differ in length")
        if len(self.parents) < 1:
            raise InvalidTree("tree spec: needs a root")
        if self.parents[0] != -1:
            raise InvalidTree("tree spec: node 0 is the root and has no parent (-1)")
        seen: set[tuple[int, int]] = set()
        prev_depth = 0
        depths = [0]
        external = False
        for i in range(1, len(self.parents)):
            p, s = self.parents[i], self.slots[i]
            if not 0 <= p < i:
                raise InvalidTree(f"tree spec: node {i} has parent {p}; parents must come before children")
            depth = depths[p] + 1
            depths.append(depth)
            if s == EXTERNAL:
                external = True
                continue
            if external:
                raise InvalidTree(f"tree spec: matrix node {i} comes after a node of another drafter")
            if s < 0:
                raise InvalidTree(f"tree spec: node {i} has negative slot {s}")
            if (p, s) in seen:
                raise InvalidTree(f"tree spec: node {i} repeats slot {s} under parent {p}")
            seen.add((p, s))
            if depth < prev_depth:
                raise InvalidTree(f"tree spec: node {i} breaks level order (depth {depth} after {prev_depth})")
            prev_depth = depth

    def __hash__(self) -> int:
        return self._hash  # specs key buffer caches every step: hash the node tuples once

    @cached_property
    def _hash(self) -> int:
        return hash((self.name, self.parents, self.slots))

    @classmethod
    def from_paths(cls, name: str, paths: list[list[int]]) -> TreeSpec:
        """Build from root-to-node slot paths, e.g. [[0], [1], [0, 0]] (Medusa-style choices)."""
        if any(slot < 0 for path in paths for slot in path):
            raise InvalidTree(f"tree spec {name}: candidate slots are ranks 0, 1, 2, ...; a path holds a negative one")
        ordered = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
        index = {(): 0}
        parents, slots = [-1], [0]
        for path in ordered:
            if not path:
                continue
            if path[:-1] not in index:
                raise InvalidTree(f"tree spec {name}: path {list(path)} has no parent path {list(path[:-1])}")
            index[path] = len(parents)
            parents.append(index[path[:-1]])
            slots.append(path[-1])
        return cls(name, tuple(parents), tuple(slots))

    @classmethod
    def from_child_counts(cls, name: str, levels: list[list[int]]) -> TreeSpec:
        """Build from child counts: levels[d][j] = children of the j-th node at depth d (slots 0..c-1)."""
        parents, slots = [-1], [0]
        frontier = [0]
        for counts in levels:
            if len(counts) != len(frontier):
                raise InvalidTree(f"tree spec {name}: level has {len(counts)} counts for {len(frontier)} nodes")
            nxt = []
            for parent, count in zip(frontier, counts, strict=True):
                for slot in range(count):
                    nxt.append(len(parents))
                    parents.append(parent)
                    slots.append(slot)
            frontier = nxt
        return cls(name, tuple(parents), tuple(slots))

    @classmethod
    def from_file(cls, path: Path) -> TreeSpec:
        """Read a JSON spec: {"name": ..., "paths": [[0], [1], [0, 0], ...]}, within sane bounds
        (file size, nodes, depth) checked before anything is built from it."""
        try:
            size = Path(path).stat().st_size
            if size > MAX_TREE_FILE_BYTES:
                raise ValueError(f"{size:,} bytes, more than {MAX_TREE_FILE_BYTES:,}")
            data = json.loads(Path(path).read_text())
            paths = data["paths"] if isinstance(data, dict) else data
            name = data.get("name", Path(path).stem) if isinstance(data, dict) else Path(path).stem
            spec = cls.from_paths(name, [list(map(int, p)) for p in paths])
        except RecursionError:
            raise InvalidTree(f"{path}: not a tree spec (nested too deeply to read)") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidTree(
                f'{path}: not a tree spec ({exc}); expected JSON {{"paths": [[0], [1], [0, 0]]}}'
            ) from None
        if spec.size == 0:
            raise InvalidTree(f"{path}: the tree has no draft nodes; for plain decoding use the preset 'none'")
        if spec.size > MAX_TREE_NODES or spec.depth > MAX_TREE_DEPTH:
            raise InvalidTree(
                f"{path}: {spec.size} nodes, {spec.depth} deep; a tree may have at most {MAX_TREE_NODES} nodes "
                f"and {MAX_TREE_DEPTH} levels (one forward verifies them all)"
            )
        return spec

    @property
    def size(self) -> int:
        """Number of draft nodes (excluding the root)."""
        return len(self.parents) - 1

    @property
    def external_size(self) -> int:
        """Nodes drafted by other drafters than the matrix."""
        return self.slots.count(EXTERNAL)

    @property
    def matrix_size(self) -> int:
        """Draft nodes that come from the matrix."""
        return self.size - self.external_size

    @classmethod
    def chain(cls, name: str, length: int) -> TreeSpec:
        """A single path of `length` nodes under the root, all drafted by another drafter."""
        return cls(name, (-1, *range(length)), (0, *(EXTERNAL,) * length))

    @classmethod
    def merge(cls, parts: tuple[TreeSpec, ...] | list[TreeSpec]) -> TreeSpec:
        """Several drafters' trees under one root: the first as it is, each later one's nodes
        after it, re-parented onto the shared root and marked EXTERNAL."""
        if not parts:
            raise InvalidTree("tree spec: nothing to merge")
        if len(parts) == 1:
            return parts[0]
        parents, slots = list(parts[0].parents), list(parts[0].slots)
        for part in parts[1:]:
            offset = len(parents) - 1  # part node i > 0 becomes merged node offset + i
            parents += [p + offset if p > 0 else 0 for p in part.parents[1:]]
            slots += [EXTERNAL] * part.size
        return cls("+".join(part.name for part in parts), tuple(parents), tuple(slots))

    def subset(self, nodes: list[int]) -> TreeSpec:
        """The tree of `nodes` (ascending, the root first, each one's parent among them), in the
        same order: parents, level order and slots stay valid."""
        index = {old: new for new, old in enumerate(nodes)}
        parents = tuple(-1 if old == 0 else index[self.parents[old]] for old in nodes)
        return TreeSpec(f"{self.name}/{len(nodes) - 1}", parents, tuple(self.slots[old] for old in nodes))

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Child node indices of every node, in node order."""
        children: list[list[int]] = [[] for _ in self.parents]
        for node in range(1, len(self.parents)):
            children[self.parents[node]].append(node)
        return tuple(tuple(c) for c in children)

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
        for i in range(1, len(self.parents) - self.external_size):
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
        if not path.exists():
            raise InvalidTree(f"{name_or_path}: no such file; use a preset ({', '.join(PRESETS)}) or a JSON spec")
        if not path.is_file():  # there, so not "no such file": a folder, a FIFO, a device
            what = "a folder" if path.is_dir() else "a device or FIFO"
            raise InvalidTree(f"{name_or_path}: {what}, not a tree spec file; use a preset or a JSON spec file")
        return TreeSpec.from_file(path)
    raise InvalidTree(f"{name_or_path}: unknown tree; use a preset ({', '.join(PRESETS)}) or a JSON spec file")
