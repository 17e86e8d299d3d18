"""Counts in messages read as English: `tr matrix init` on one text block said "1 texts", a
designed one-node tree "(1 nodes, ...)"."""

import pytest
import torch

from tr_cli.core.drafters.matrix_tree import MatrixTreeDrafter
from tr_cli.core.tree import TreeSpec
from tr_cli.core.wording import counted


@pytest.mark.parametrize(
    ("count", "noun", "plural", "expected"),
    [
        (1, "text", None, "1 text"),
        (0, "text", None, "0 texts"),
        (3, "node", None, "3 nodes"),
        (12345, "conversation", None, "12,345 conversations"),
        (1, "entry", "entries", "1 entry"),
        (2, "entry", "entries", "2 entries"),
    ],
)
def test_a_count_takes_its_nouns_number(count, noun, plural, expected):
    assert counted(count, noun, plural) == expected


@pytest.mark.parametrize(("paths", "words"), [([[0]], "(1 node)"), ([[0], [1], [0, 0]], "(3 nodes)")])
def test_a_tree_is_described_with_its_count_of_nodes(paths, words):
    drafter = MatrixTreeDrafter(torch.zeros(16, 4, dtype=torch.long), TreeSpec.from_paths("small", paths))
    assert drafter.describe() == f"tree small {words}"
