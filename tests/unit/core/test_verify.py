"""greedy_accept: the longest root-to-node path whose every token equals the model's argmax after
its parent, plus the bonus token (the argmax after the last accepted node). Every case runs both
ways it is computed: a pass over lists (CPU) and tensor ops (accelerators)."""

from __future__ import annotations

import pytest
import torch

from tr_cli.core import PRESETS, TreeBuffers, TreeSpec
from tr_cli.core.verify import accept_on_device, greedy_accept

V = 64

# Node order (BFS, from_paths): 1=[0] 2=[1] 3=[0,0] 4=[0,1] 5=[1,0] 6=[0,0,0]
# Parents:                      1->0  2->0  3->1   4->1   5->2   6->3
SMALL = TreeSpec.from_paths("small", [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])


def test_small_tree_layout():
    """The node numbering the hand-made cases below rely on."""
    assert SMALL.parents == (-1, 0, 0, 1, 1, 2, 3)
    assert SMALL.slots == (0, 0, 1, 0, 1, 0, 0)


def logits_with_argmax(argmax: list[int], vocab: int = V) -> torch.Tensor:
    """Logits whose argmax at node i is argmax[i] (random noise below a clear winner)."""
    g = torch.Generator().manual_seed(len(argmax))
    logits = torch.rand(len(argmax), vocab, generator=g)
    for i, a in enumerate(argmax):
        logits[i, a] = 5.0
    return logits


@pytest.fixture(params=["lists", "tensors"])
def accept(request):
    """greedy_accept as the CPU computes it, or with the tensor ops an accelerator's path takes."""
    if request.param == "lists":
        return greedy_accept
    return lambda tokens, logits, buffers: accept_on_device(tokens, logits.argmax(-1), buffers)


@pytest.fixture()
def run(accept):
    def run(tokens: list[int], argmax: list[int], spec: TreeSpec = SMALL):
        return accept(torch.tensor(tokens), logits_with_argmax(argmax), TreeBuffers.build(spec))

    return run


def test_nothing_accepted(run):
    """No child of the root matches the root's argmax: nothing accepted, bonus = root argmax."""
    #         root n1  n2  n3  n4  n5  n6
    tokens = [10, 11, 12, 13, 14, 15, 16]
    argmax = [40, 13, 15, 16, 1, 2, 3]  # deeper nodes "match" their parents, but the first level fails
    acc = run(tokens, argmax)
    assert acc.nodes == []
    assert acc.tokens == []
    assert acc.bonus == 40
    assert (acc.tokens + [acc.bonus]) == [40]


def test_longest_path_wins_over_shallower_correct_branch(run):
    """n1 and n2 both match the root (same token); n2->n5 is correct (depth 2) but n1->n3->n6
    is correct to depth 3 and must win."""
    tokens = [10, 20, 20, 30, 31, 32, 40]
    argmax = [20, 30, 32, 40, 0, 50, 60]
    acc = run(tokens, argmax)
    assert acc.nodes == [1, 3, 6]
    assert acc.tokens == [20, 30, 40]
    assert acc.bonus == 60
    assert (acc.tokens + [acc.bonus]) == [20, 30, 40, 60]


def test_longest_path_wins_when_listed_second(run):
    """Same as above with the deep branch under slot 1, so the shallow one comes first in BFS order."""
    # 1=[0] 2=[1] 3=[0,0] 4=[1,0] 5=[1,0,0]
    spec = TreeSpec.from_paths("t", [[0], [1], [0, 0], [1, 0], [1, 0, 0]])
    assert spec.parents == (-1, 0, 0, 1, 2, 4)
    tokens = [10, 20, 20, 30, 31, 41]
    argmax = [20, 30, 31, 7, 41, 8]
    acc = run(tokens, argmax, spec)
    assert acc.nodes == [2, 4, 5]
    assert acc.tokens == [20, 31, 41]
    assert acc.bonus == 8


def test_partial_path_stops_at_first_mismatch(run):
    """n1 correct, n3 wrong: accept only n1; bonus is the argmax after n1."""
    tokens = [10, 20, 21, 30, 31, 32, 40]
    argmax = [20, 33, 0, 40, 0, 0, 60]
    acc = run(tokens, argmax)
    assert acc.nodes == [1]
    assert acc.tokens == [20]
    assert acc.bonus == 33


def test_full_depth_accepted(run):
    """The whole deepest chain is right: accept all three, bonus after the leaf."""
    tokens = [10, 20, 21, 30, 31, 32, 40]
    argmax = [20, 30, 0, 40, 0, 0, 55]
    acc = run(tokens, argmax)
    assert acc.nodes == [1, 3, 6]
    assert acc.tokens == [20, 30, 40]
    assert acc.bonus == 55


def test_duplicate_siblings_same_tokens_either_way(run):
    """n1 and n2 carry the same token and both are right, and so are their children n3 and n5
    (again the same token): either branch gives the same accepted tokens and bonus."""
    tokens = [10, 20, 20, 30, 31, 30, 41]
    argmax = [20, 30, 30, 40, 0, 40, 0]  # n6 (41) is wrong under n3 (argmax 40)
    acc = run(tokens, argmax)
    assert acc.nodes in ([1, 3], [2, 5])
    assert acc.tokens == [20, 30]
    assert acc.bonus == 40


def test_correct_child_of_wrong_parent_not_accepted(run):
    """n3 and n6 match their parents' argmax, but n1 is wrong: none of them may be accepted."""
    tokens = [10, 21, 22, 30, 31, 32, 40]
    argmax = [20, 30, 32, 40, 0, 0, 60]
    acc = run(tokens, argmax)
    # n2 (22) is wrong too, so n5 (32, matching n2's argmax) must not count either.
    assert acc.nodes == []
    assert acc.bonus == 20


def test_correct_grandchild_under_wrong_middle_not_accepted(run):
    """n1 right, n3 wrong, n6 matches n3's argmax: accept only n1."""
    tokens = [10, 20, 21, 35, 31, 32, 40]
    argmax = [20, 30, 0, 40, 0, 0, 60]
    acc = run(tokens, argmax)
    assert acc.nodes == [1]
    assert acc.bonus == 30


def _chain(spec: TreeSpec, i: int) -> list[int]:
    out = []
    while i != 0:
        out.append(i)
        i = spec.parents[i]
    return out[::-1]


def test_paper_tree_deepest_leaf(accept):
    """On the paper tree with distinct tokens, making one depth-6 chain correct accepts exactly it."""
    spec = PRESETS["paper"]
    n = spec.size
    leaf = max(range(1, n + 1), key=lambda i: (spec.depths[i], i))
    assert spec.depths[leaf] == 6
    chain = _chain(spec, leaf)
    tokens = [1000] + [1000 + i for i in range(1, n + 1)]  # all distinct
    argmax = [0] * (n + 1)  # 0 is no node's token
    prev = 0
    for node in chain:
        argmax[prev] = tokens[node]
        prev = node
    argmax[leaf] = 7
    buffers = TreeBuffers.build(spec)
    acc = accept(torch.tensor(tokens), logits_with_argmax(argmax, 1200), buffers)
    assert acc.nodes == chain
    assert acc.tokens == [tokens[i] for i in chain]
    assert acc.bonus == 7


def _reference_best_length(spec: TreeSpec, tokens: list[int], argmax: list[int]) -> int:
    """Longest chain of correct nodes from the root, by depth-first search."""
    children: dict[int, list[int]] = {}
    for i in range(1, len(spec.parents)):
        children.setdefault(spec.parents[i], []).append(i)

    def best(node: int) -> int:
        return max((1 + best(c) for c in children.get(node, []) if tokens[c] == argmax[node]), default=0)

    return best(0)


@pytest.mark.parametrize("seed", range(20))
def test_random_against_reference(seed, accept):
    """Random small-vocabulary trees on the paper spec: the result is a valid, maximal accepted chain."""
    spec = PRESETS["paper"]
    g = torch.Generator().manual_seed(seed)
    vocab = 3  # small so that many nodes are correct by chance
    tokens = torch.randint(0, vocab, (spec.size + 1,), generator=g)
    logits = torch.randn(spec.size + 1, vocab, generator=g)
    argmax = logits.argmax(-1).tolist()
    acc = accept(tokens, logits, TreeBuffers.build(spec))
    tok = tokens.tolist()
    assert len(acc.nodes) == _reference_best_length(spec, tok, argmax)
    prev = 0
    for node in acc.nodes:
        assert spec.parents[node] == prev
        assert tok[node] == argmax[prev]
        prev = node
    assert acc.tokens == [tok[i] for i in acc.nodes]
    assert acc.bonus == argmax[prev]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [0.01, 1.0, 4.0])
def test_argmax_from_top_k_equals_argmax_even_with_ties(dtype, scale):
    """Rounded logits tie a lot (bf16 more so); the first index among equal maxima must win, as in
    `argmax`, or greedy output would differ from `generate`."""
    from tr_cli.core.verify import TopCandidates

    g = torch.Generator().manual_seed(int(scale * 100))
    logits = (torch.randn(81, 3000, generator=g) * scale).round().to(dtype)
    logits[3] = 0  # every entry tied: more ties than k
    logits[4, :20] = 50  # 20 tied maxima
    for k in (1, 2, 8):
        top = TopCandidates.of(logits, k)
        assert torch.equal(top.argmax(logits), logits.argmax(dim=-1))
