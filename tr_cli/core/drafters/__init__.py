"""Sources of draft tokens behind one interface (base.Drafter), and how their drafts are merged."""

from .base import Draft, Drafter, Placement, Verification
from .lookup_chain import LookupChainDrafter
from .matrix_tree import MatrixTreeDrafter, draft_tree
from .merge import DraftMerger

__all__ = [
    "Draft",
    "DraftMerger",
    "Drafter",
    "LookupChainDrafter",
    "MatrixTreeDrafter",
    "Placement",
    "Verification",
    "draft_tree",
]
