"""Tree specs and their derived buffers: the paper preset's shape, the buffers against brute-force
references built from parent pointers, path round-trips, validation and `resolve_tree`."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tr_cli.core import PRESETS, TreeBuffers, TreeSpec, resolve_tree

# A small irregular tree: root has 3 children; node [0] has 2, node [1] has 1, [0,0] has a chain.
HAND_PATHS = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0], [0, 1, 0]]


def hand_tree() -> TreeSpec:
    return TreeSpec.from_paths("hand", HAND_PATHS)


def _specs() -> list[TreeSpec]:
    return [
        PRESETS["paper"],
        hand_tree(),
        TreeSpec.from_paths("chain", [[0], [0, 0], [0, 0, 0]]),
        TreeSpec.from_paths("flat", [[0], [1], [2], [3]]),
    ]


def _children(spec: TreeSpec) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {i: [] for i in range(len(spec.parents))}
    for i in range(1, len(spec.parents)):
        out[spec.parents[i]].append(i)
    return out


def _chain(spec: TreeSpec, i: int) -> list[int]:
    """Node i and its ancestors, root last, by walking parent pointers."""
    out = [i]
    while i != 0:
        i = spec.parents[i]
        out.append(i)
    return out


# --- the paper preset -------------------------------------------------------------------------


def test_paper_preset_shape():
    """The paper tree has 80 draft nodes over 6 levels of widths 8/21/25/15/8/3."""
    spec = PRESETS["paper"]
    assert spec.size == 80
    assert spec.depth == 6
    assert spec.widths() == [8, 21, 25, 15, 8, 3]
    # Independent count of depth per node via parent hops.
    counts = [0] * 7
    for i in range(1, 81):
        counts[len(_chain(spec, i)) - 1] += 1
    assert counts[1:] == [8, 21, 25, 15, 8, 3]
    assert spec.max_slot == 7  # fits the default k = 8


def test_paper_children_use_leading_slots():
    """Every node's children occupy slots 0..c-1 (no gaps, no repeats)."""
    spec = PRESETS["paper"]
    for parent, kids in _children(spec).items():
        assert sorted(spec.slots[k] for k in kids) == list(range(len(kids))), parent


# --- buffers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.name)
def test_ancestor_mask_matches_parent_walk(spec):
    """ancestor_mask[i, j] is True exactly when j is i or one of its ancestors."""
    buf = TreeBuffers.build(spec)
    n1 = spec.size + 1
    assert buf.ancestor_mask.shape == (n1, n1)
    assert buf.ancestor_mask.dtype == torch.bool
    expected = torch.zeros(n1, n1, dtype=torch.bool)
    for i in range(n1):
        for j in _chain(spec, i):
            expected[i, j] = True
    assert torch.equal(buf.ancestor_mask, expected)


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.name)
def test_depths_parents_slots(spec):
    """depths = number of parent hops to the root; parents point up (root to itself); slots copied."""
    buf = TreeBuffers.build(spec)
    hops = [len(_chain(spec, i)) - 1 for i in range(spec.size + 1)]
    assert buf.depths.tolist() == hops
    assert list(spec.depths) == hops
    assert buf.parents.tolist() == [0] + list(spec.parents[1:])
    assert buf.slots.tolist() == list(spec.slots)
    assert buf.size == spec.size + 1
    # Positions of tree tokens relative to the root are the depths: a node's position is one past
    # its parent's.
    for i in range(1, spec.size + 1):
        assert buf.depths[i] == buf.depths[spec.parents[i]] + 1


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.name)
def test_leaf_paths(spec):
    """One row per leaf, each the root-to-leaf chain (root excluded) padded with n+1; all nodes covered."""
    buf = TreeBuffers.build(spec)
    n = spec.size
    kids = _children(spec)
    leaves = [i for i in range(1, n + 1) if not kids[i]]
    rows = buf.leaf_paths.tolist()
    assert buf.leaf_paths.shape == (len(leaves), spec.depth)
    assert buf.leaf_paths.dtype == torch.long
    expected_rows = []
    for leaf in leaves:
        chain = list(reversed(_chain(spec, leaf)))[1:]
        expected_rows.append(chain + [n + 1] * (spec.depth - len(chain)))
    assert sorted(rows) == sorted(expected_rows)
    covered = {x for row in rows for x in row if x != n + 1}
    assert covered == set(range(1, n + 1))


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.name)
def test_level_slices(spec):
    """level_slices are contiguous [start, end) ranges covering 1..n, one per depth, in order."""
    buf = TreeBuffers.build(spec)
    slices = buf.level_slices
    assert len(slices) == spec.depth
    assert slices[0][0] == 1
    assert slices[-1][1] == spec.size + 1
    for (_, e0), (s1, _) in zip(slices, slices[1:], strict=False):
        assert e0 == s1
    for d, (start, end) in enumerate(slices, start=1):
        assert end > start
        assert all(spec.depths[i] == d for i in range(start, end))


# --- paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.name)
def test_paths_round_trip(spec):
    """from_paths(paths()) gives back the same parents and slots."""
    again = TreeSpec.from_paths("again", spec.paths())
    assert again.parents == spec.parents
    assert again.slots == spec.slots


def test_from_paths_hand_tree():
    """A hand-made tree: paths map to BFS order, parents and slots follow the paths."""
    spec = hand_tree()
    assert spec.size == len(HAND_PATHS)
    paths = spec.paths()
    assert sorted(map(tuple, paths)) == sorted(map(tuple, HAND_PATHS))
    # Each node's path is its parent's path plus its slot.
    full = [[]] + paths
    for i in range(1, spec.size + 1):
        assert full[i] == full[spec.parents[i]] + [spec.slots[i]]
    # Level order: path lengths never decrease.
    assert [len(p) for p in paths] == sorted(len(p) for p in paths)
    assert spec.widths() == [3, 3, 2, 1]


def test_from_paths_dedupes_and_sorts():
    """Duplicated and shuffled paths give the same tree as the clean list."""
    messy = list(reversed(HAND_PATHS)) + [[0], [0, 1]]
    assert TreeSpec.from_paths("m", messy).parents == hand_tree().parents
    assert TreeSpec.from_paths("m", messy).slots == hand_tree().slots


def test_from_child_counts_matches_paths():
    """Child counts per level build the same tree as the equivalent paths."""
    a = TreeSpec.from_child_counts("a", [[2], [2, 1], [1, 0, 0]])
    b = TreeSpec.from_paths("b", [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    assert (a.parents, a.slots) == (b.parents, b.slots)
    with pytest.raises(ValueError):
        TreeSpec.from_child_counts("bad", [[2], [1]])  # 1 count for 2 nodes


def test_other_drafters_nodes_may_branch():
    """Nodes of other drafters (EXTERNAL) follow the matrix nodes and may form several branches."""
    spec = TreeSpec("branches", (-1, 0, 0, 0, 2), (0, 0, -1, -1, -1))
    assert (spec.matrix_size, spec.external_size, spec.children[0]) == (1, 3, (1, 2, 3))


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parents, slots",
    [
        ((-1, 2, 0), (0, 0, 0)),  # node 1's parent comes after it
        ((-1, 0, 1), (0, 0, 0, 0)),  # length mismatch
        ((-1, 0, 0), (0, 1, 1)),  # duplicate slot under the same parent
        ((-1, 0, 1, 0), (0, 0, 0, 1)),  # depth 1 node after a depth 2 node
        ((-1, 1), (0, 0)),  # node is its own parent
        ((0, 0), (0, 0)),  # root with a parent
        ((-1, 0), (0, -2)),  # negative slot (-1 marks another drafter's node)
        ((-1, 0, 0), (0, -1, 0)),  # matrix node after another drafter's node
        ((-1, 0, 1), (0, -1, 0)),  # matrix node under another drafter's node
        ((), ()),  # no root at all
    ],
)
def test_invalid_specs_raise(parents, slots):
    with pytest.raises(ValueError):
        TreeSpec("bad", parents, slots)


@pytest.mark.parametrize("paths", [[], [[]]])
def test_tree_without_draft_nodes_is_plain_decoding_but_not_from_a_file(paths, tmp_path):
    spec = TreeSpec.from_paths("empty", paths)
    assert (spec.size, spec.depth, spec.parents) == (0, 0, (-1,))
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"paths": paths}))
    with pytest.raises(ValueError, match="no draft nodes.*the preset 'none'"):
        TreeSpec.from_file(path)


def test_from_paths_missing_parent_raises():
    with pytest.raises(ValueError, match="parent"):
        TreeSpec.from_paths("bad", [[0], [0, 1, 0]])


# --- resolve_tree -----------------------------------------------------------------------------


def test_resolve_preset():
    assert resolve_tree("paper") is PRESETS["paper"]


def test_resolve_json_file(tmp_path):
    """A JSON {"name", "paths"} file and a bare list of paths both load."""
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"name": "mine", "paths": HAND_PATHS}))
    spec = resolve_tree(str(f))
    assert spec.name == "mine"
    assert (spec.parents, spec.slots) == (hand_tree().parents, hand_tree().slots)

    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(HAND_PATHS))
    spec = resolve_tree(str(bare))
    assert spec.name == "bare"
    assert spec.parents == hand_tree().parents


def test_resolve_unknown_name():
    with pytest.raises(ValueError, match="unknown tree"):
        resolve_tree("no-such-preset")


def test_resolve_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        resolve_tree(str(tmp_path / "absent.json"))


@pytest.mark.parametrize("kind", ["folder", "device", "fifo"])
def test_resolve_a_path_that_is_there_but_not_a_file(tmp_path, kind):
    # `--tree /dev/zero`, a FIFO or a folder said "no such file"
    path = {"folder": tmp_path, "device": "/dev/zero", "fifo": tmp_path / "pipe"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(ValueError) as info:
        resolve_tree(str(path))
    what = "a folder" if kind == "folder" else "a device or FIFO"
    assert str(info.value).startswith(f"{path}: {what}, not a tree spec file;"), str(info.value)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"name": "x"}),
        json.dumps({"paths": 5}),
        json.dumps({"paths": [[0], [0, 1, 2]]}),
        json.dumps({"paths": [1, 2]}),
    ],
    ids=["syntax", "no-paths", "paths-not-list", "missing-parent", "paths-not-lists"],
)
def test_resolve_bad_json(tmp_path, content):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ValueError, match="not a tree spec"):
        resolve_tree(str(f))
