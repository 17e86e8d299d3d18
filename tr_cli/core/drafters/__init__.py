"""Sources of draft tokens behind one interface (base.Drafter), and how their drafts are merged."""

from .base import Draft, Drafter, Placement, Verification
from .conversation_lookup import ConversationLookupDrafter
from .matrix_tree import MatrixTreeDrafter, draft_tree
from .merge import DraftMerger
from .store_lookup import StoreLookupDrafter

__all__ = [
    "ConversationLookupDrafter",
    "Draft",
    "DraftMerger",
    "Drafter",
    "MatrixTreeDrafter",
    "Placement",
    "StoreLookupDrafter",
    "Verification",
    "draft_tree",
]
