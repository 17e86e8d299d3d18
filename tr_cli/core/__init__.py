"""The decoding core: matrix, tree, drafting, verification, KV cache and the decode loop.

Pure torch + transformers; no CLI, Rich or prompt-toolkit imports here.
"""

from .decode import GenerationResult, GenerationStats, StepEvent, StepTimings, TokenRecyclingDecoder
from .matrix import DEFAULT_K, new_matrix
from .stopping import StopCondition
from .tree import PRESETS, TreeBuffers, TreeSpec, resolve_tree

__all__ = [
    "DEFAULT_K",
    "PRESETS",
    "GenerationResult",
    "GenerationStats",
    "StepEvent",
    "StepTimings",
    "StopCondition",
    "TokenRecyclingDecoder",
    "TreeBuffers",
    "TreeSpec",
    "new_matrix",
    "resolve_tree",
]
