"""What a user chooses about decoding, as plain values checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core.drafters.conversation_lookup import DEFAULT_LOOKUP_LENGTH
from ..core.matrix import DEFAULT_K
from ..core.sampling_config import SamplingRequest
from ..core.tree import TreeSpec


@dataclass(frozen=True)
class TreeChoice:
    """The drafts asked for: a fixed matrix tree (None: designed for this device) and the length
    of the prompt-lookup chain (0: none)."""

    spec: TreeSpec | None = None
    lookup_length: int = DEFAULT_LOOKUP_LENGTH

    def __post_init__(self) -> None:
        if self.lookup_length < 0:
            raise ValueError(f"lookup chain length must be 0 (off) or more, got {self.lookup_length}")

    @classmethod
    def of(cls, spec: TreeSpec | None, lookup_length: int | None) -> TreeChoice:
        """A designed tree drafts a lookup chain by default; a fixed tree stays as written."""
        if lookup_length is None:
            lookup_length = DEFAULT_LOOKUP_LENGTH if spec is None else 0
        return cls(spec, lookup_length)

    @property
    def name(self) -> str:
        base = self.spec.name if self.spec else "auto"
        return f"{base}+lookup{self.lookup_length}" if self.lookup_length else base


@dataclass(frozen=True)
class EngineOptions:
    """Everything that decides how a model decodes for a user."""

    model: str | None = None  # None: the packaged default
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "dense"  # models/weights.WEIGHTS
    tree: TreeChoice = field(default_factory=TreeChoice)
    k: int = DEFAULT_K
    matrix: Path | None = None  # None: the model's stored matrix
    cold: bool = False  # start from an empty matrix (the stored one is not read)
    save: bool = True  # write the matrix back
    sampling: SamplingRequest | None = None  # None: greedy
