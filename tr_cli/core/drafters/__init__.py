"""Sources of draft tokens behind one interface (base.Drafter), and how their drafts are merged.

The names below load their modules (torch) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_names import lazy_names

if TYPE_CHECKING:
    from .base import Draft, Drafter, Placement, Verification
    from .conversation_lookup import ConversationLookupDrafter
    from .matrix_tree import MatrixTreeDrafter, draft_tree
    from .merge import DraftMerger, TreeMerge
    from .plan import SOURCES, DraftPlan
    from .planner import DraftPlanner
    from .store_lookup import StoreLookupDrafter

_HOMES = {
    "Draft": ".base",
    "Drafter": ".base",
    "Placement": ".base",
    "Verification": ".base",
    "ConversationLookupDrafter": ".conversation_lookup",
    "MatrixTreeDrafter": ".matrix_tree",
    "draft_tree": ".matrix_tree",
    "DraftMerger": ".merge",
    "TreeMerge": ".merge",
    "SOURCES": ".plan",
    "DraftPlan": ".plan",
    "DraftPlanner": ".planner",
    "StoreLookupDrafter": ".store_lookup",
}

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


__getattr__ = lazy_names(__name__, _HOMES)
