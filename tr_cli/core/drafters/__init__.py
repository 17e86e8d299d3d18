"""Sources of draft tokens behind one interface (base.Drafter), and how their drafts are merged."""

from .base import Draft, Drafter, Placement, Verification
from .conversation_lookup import ConversationLookupDrafter
from .matrix_tree import MatrixTreeDrafter, draft_tree
from .merge import DraftMerger, TreeMerge
from .plan import SOURCES, DraftPlan
from .planner import DraftPlanner
from .store_lookup import StoreLookupDrafter

__all__ = [
    "ConversationLookupDrafter",
    "Draft",
    "DraftMerger",
    "DraftPlan",
    "DraftPlanner",
    "Drafter",
    "MatrixTreeDrafter",
    "Placement",
    "SOURCES",
    "StoreLookupDrafter",
    "TreeMerge",
    "Verification",
    "draft_tree",
]
