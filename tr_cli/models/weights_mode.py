"""How a model's matmul weights are held, as one value: dense, or torch's weight-only int8/int4
kernels, optionally with the bfloat16 weights kept for prompts; and the names a user picks them
by. No torch here: the command line lists the names before anything loads (runtime.py resolves
a name against the device)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SettingError

QUANTIZED_KINDS = ("int8", "int4")
PROMPT_SUFFIX = "+bf16"


@dataclass(frozen=True)
class WeightsMode:
    """How the matmul weights are held: dense (in the model's dtype), or quantized (`int8`/`int4`
    weight-only kernels), optionally keeping the bfloat16 weights for prompts (`+bf16`)."""

    quantized: str | None = None  # None: dense
    bf16_prompts: bool = False

    def __post_init__(self) -> None:
        if self.quantized is not None and self.quantized not in QUANTIZED_KINDS:
            raise ValueError(f"unknown quantization {self.quantized!r}")
        if self.bf16_prompts and self.quantized is None:
            raise ValueError("bfloat16 prompt weights come with a quantized mode")

    @classmethod
    def parse(cls, text: str) -> WeightsMode:
        """'dense', 'int8', 'int4', 'int8+bf16' or 'int4+bf16' ('auto' is Runtime.resolve's)."""
        if text == "dense":
            return DENSE
        kind = text.removesuffix(PROMPT_SUFFIX)
        if kind not in QUANTIZED_KINDS:
            raise SettingError("weights", text, f"unknown; use {', '.join(MODE_NAMES)}")
        return cls(kind, text.endswith(PROMPT_SUFFIX))

    @property
    def dense(self) -> bool:
        return self.quantized is None

    @property
    def name(self) -> str:
        if self.quantized is None:
            return "dense"
        return self.quantized + (PROMPT_SUFFIX if self.bf16_prompts else "")

    def __str__(self) -> str:
        return self.name


DENSE = WeightsMode()
AUTO = "auto"  # the weights setting that follows the model file (auto_weights)
MODE_NAMES = ("dense", *QUANTIZED_KINDS, *(kind + PROMPT_SUFFIX for kind in QUANTIZED_KINDS))
WEIGHTS_NAMES = (AUTO, *MODE_NAMES)
QUANTIZED_MODES = tuple(WeightsMode.parse(name) for name in MODE_NAMES if name != "dense")
