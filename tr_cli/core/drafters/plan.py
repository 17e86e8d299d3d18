"""Which drafts a decoder verifies: the matrix tree's shape and the further draft sources, as one
value parsed in one place.

The text form is `TREE[+SOURCE[DEPTH]]...`: `auto` (the tree designed for this device),
`paper`, `none` or a JSON tree file, then any sources by name, e.g. `auto+lookup5`,
`paper+lookup10`, `auto+store0`. A designed tree drafts every source at its default depth unless
told otherwise; a fixed tree (the paper's method) drafts only the sources named. DEPTH 0 turns a
source off; no DEPTH means its default.

A new draft source is a Drafter (base.py) plus one entry in SOURCES: a name, a default depth and a
function building the drafter. The plan then parses it, `tr bench` accepts it in `tr:…` methods,
and every decoder the engine builds drafts from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidTree
from ..tree import TreeSpec, resolve_tree

if TYPE_CHECKING:  # the drafters need torch: built on demand, so that a plan parses without it
    import torch

    from ..recycled_store import RecycledStore
    from .base import Drafter

DESIGNED = "auto"  # the tree's name for "designed for this device"
MAX_DEPTH = 64  # a source's draft of N tokens is verified in one forward
DEFAULT_LOOKUP_LENGTH = 10  # deepest node of a lookup draft
STORE_DEPTH = 24  # a resent context can match for long: deep drafts pay only when sure (the planner)


@dataclass(frozen=True)
class SourceContext:
    """What a source is built from: the decoder's device, the recycled store (None: not opened),
    and whether steps are planned (priced nodes, several branches) or verified whole."""

    device: torch.device | str
    store: RecycledStore | None
    planned: bool


@dataclass(frozen=True)
class Source:
    default_depth: int
    on_designed_tree: bool  # drafted by default beside a designed tree
    build: Callable[[int, SourceContext], Drafter | None]


def _lookup(depth: int, context: SourceContext) -> Drafter:
    from .conversation_lookup import LOOKUP_BRANCHES, ConversationLookupDrafter

    # Unplanned, a lookup drafts one chain (its nodes are verified whether they pay or not).
    return ConversationLookupDrafter(depth, context.device, LOOKUP_BRANCHES if context.planned else 1)


def _store(depth: int, context: SourceContext) -> Drafter | None:
    from .store_lookup import StoreLookupDrafter

    return None if context.store is None else StoreLookupDrafter(context.store, context.device, depth)


SOURCES: dict[str, Source] = {
    "lookup": Source(DEFAULT_LOOKUP_LENGTH, True, _lookup),  # this conversation's earlier text
    "store": Source(STORE_DEPTH, True, _store),  # earlier conversations (the recycled store)
}

_PART = re.compile(r"\+([a-z]+)(\d*)$")


@dataclass(frozen=True)
class DraftPlan:
    """The matrix tree (None: designed for the device, every step planned) and each further
    source's depth (0: off), in SOURCES order."""

    tree: TreeSpec | None = None
    depths: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        for name, depth in self.depths:
            if name not in SOURCES:
                raise InvalidTree(f"unknown draft source {name!r}; sources: {', '.join(SOURCES)}")
            if not 0 <= depth <= MAX_DEPTH:
                raise InvalidTree(
                    f"a {name} draft of depth {depth}: 0 (off) to at most {MAX_DEPTH} "
                    f"(default {SOURCES[name].default_depth})"
                )

    @classmethod
    def parse(cls, text: str) -> DraftPlan:
        """`auto`, `paper+lookup10`, `auto+store0`, `trees/my.json+lookup`... InvalidTree says what
        is wrong (naming no flag: the caller knows where the text came from)."""
        text = text.strip()
        given: dict[str, int] = {}
        while (match := _PART.search(text)) and match.group(1) in SOURCES:
            name, digits = match.groups()
            given.setdefault(name, int(digits) if digits else SOURCES[name].default_depth)
            text = text[: match.start()]
        if not text:
            raise InvalidTree("no tree named before the draft sources; e.g. auto+lookup10")
        return cls.of(None if text == DESIGNED else resolve_tree(text), given)

    @classmethod
    def of(cls, tree: TreeSpec | None = None, given: dict[str, int] | None = None) -> DraftPlan:
        """The sources a tree drafts by default, with `given` depths over them."""
        given = given or {}
        depths = []
        for name, source in SOURCES.items():
            default = source.default_depth if tree is None and source.on_designed_tree else 0
            depths.append((name, given.get(name, default)))
        return cls(tree, tuple(depths))

    def with_depth(self, name: str, depth: int) -> DraftPlan:
        """The same plan with source `name` at `depth`."""
        return DraftPlan.of(self.tree, {**dict(self.depths), name: depth})

    def depth(self, name: str) -> int:
        return dict(self.depths).get(name, 0)

    @property
    def designed(self) -> bool:
        return self.tree is None

    @property
    def name(self) -> str:
        """The plan in its text form, every source spelled out: 'auto+lookup10+store24', 'paper'."""
        parts = [DESIGNED if self.tree is None else self.tree.name]
        parts += [f"{name}{depth}" for name, depth in self.depths if depth]
        return "+".join(parts)

    def drafters(self, device: torch.device | str, store: RecycledStore | None = None) -> list[Drafter]:
        """The further sources' drafters (the decoder drafts the matrix tree itself)."""
        context = SourceContext(device, store, self.designed)
        built = [SOURCES[name].build(depth, context) for name, depth in self.depths if depth]
        return [drafter for drafter in built if drafter is not None]
