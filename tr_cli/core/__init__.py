"""The decoding core: matrix, trees, drafters, verification, sampling, KV cache and the decode loop.

Pure torch + transformers; nothing here imports the rest of tr (nor Typer, Rich or prompt-toolkit).
"""

from .decode import TokenRecyclingDecoder
from .errors import InvalidTree, TrError, UnsupportedAttention
from .events import GenerationResult, GenerationStats, StepEvent, StepTimings, track
from .matrix import DEFAULT_K, new_matrix
from .stopping import StopCondition
from .tree import PRESETS, TreeSpec, resolve_tree
from .tree_buffers import TreeBuffers

__all__ = [
    "DEFAULT_K",
    "PRESETS",
    "GenerationResult",
    "GenerationStats",
    "InvalidTree",
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
