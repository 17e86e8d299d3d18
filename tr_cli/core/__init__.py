"""The decoding core: matrix, trees, drafters, verification, sampling, KV cache and the decode loop.

Pure torch + transformers; nothing here imports the rest of tr (nor Typer, Rich or prompt-toolkit).

The names below load their modules (torch, transformers) on first use: the command line's
--help and argument checks never pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy_names import lazy_names

if TYPE_CHECKING:
    from .decode import TokenRecyclingDecoder
    from .errors import InvalidTree, TrError, UnsupportedAttention
    from .events import GenerationResult, GenerationStats, StepEvent, StepTimings, track
    from .matrix import new_matrix
    from .matrix_width import DEFAULT_K
    from .stopping import StopCondition
    from .tree import PRESETS, TreeSpec, resolve_tree
    from .tree_buffers import TreeBuffers

_HOMES = {
    "TokenRecyclingDecoder": ".decode",
    "InvalidTree": ".errors",
    "TrError": ".errors",
    "UnsupportedAttention": ".errors",
    "GenerationResult": ".events",
    "GenerationStats": ".events",
    "StepEvent": ".events",
    "StepTimings": ".events",
    "track": ".events",
    "DEFAULT_K": ".matrix_width",
    "new_matrix": ".matrix",
    "StopCondition": ".stopping",
    "PRESETS": ".tree",
    "TreeSpec": ".tree",
    "resolve_tree": ".tree",
    "TreeBuffers": ".tree_buffers",
}

__all__ = [
    "DEFAULT_K",
    "GenerationResult",
    "GenerationStats",
    "InvalidTree",
    "PRESETS",
    "StepEvent",
    "StepTimings",
    "StopCondition",
    "TokenRecyclingDecoder",
    "TrError",
    "TreeBuffers",
    "TreeSpec",
    "UnsupportedAttention",
    "new_matrix",
    "resolve_tree",
    "track",
]


__getattr__ = lazy_names(__name__, _HOMES)
