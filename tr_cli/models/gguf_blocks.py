"""What tr makes of each ggml type: which of its kernels' kinds holds a type's values closest,
which types go into them straight from their blocks (gguf_repack.cpp), and every other type's
values through gguf's own `dequantize`, one tensor at a time.

Straight from the blocks, the same numbers: Q4_0 (value (q - 8) d) and Q4_1 (q d + m) as int4 levels
q with step d and minimum -8 d or m; Q5_0 ((q - 16) d) and Q5_1 (q d + m) as int5 levels q, the
same way; Q8_0 (q d) and Q5_0 as int8 levels. Q4_K and Q5_K (256-weight super-blocks: eight groups
of 32, value d sc q - dmin m with 6-bit sc and m) as int4 / int5 levels q with each group's d sc
and -dmin m rounded to float16, the kernels' type (tests/unit/models/test_gguf_tensors.py measures
what that rounding changes). Every other type
gguf reads (Q6_K, Q2_K, Q3_K, IQ*, F16, BF16, F32, ...) is dequantized and quantized as
a float weight is (weights.py's `_quantize`); gguf_repack.cpp does that itself for
the types of common files (REQUANTIZED), with the same numbers.
"""

from __future__ import annotations

import numpy as np
import torch

# ggml type ids (gguf.constants.GGMLQuantizationType), the ones read here without gguf's dequantize.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
FLOAT_TYPES = (F32, F16, BF16)
GROUP = 32  # the kernels' group of inputs
# Types whose values the int4 kernels hold closest (4 bits or fewer) and the int8 ones (5 to 8):
# the same split as runtime.py's auto weights mode, by the type's name.
_INT4_NAMES = ("Q4", "IQ4", "Q3", "IQ3", "Q2", "IQ2", "IQ1", "Q1", "TQ", "MXFP4", "NVFP4")
_INT8_NAMES = ("Q5", "Q6", "Q8")


def type_name(ggml_type: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def readable(ggml_type: int) -> bool:
    """Whether this reader can take a tensor of this type (gguf's dequantize knows it)."""
    import gguf.quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        kind = GGMLQuantizationType(ggml_type)
    except ValueError:
        return False
    # gguf.quants names each type's reader after the type
    return kind in FLOAT_TYPES or (kind in GGML_QUANT_SIZES and hasattr(gguf.quants, kind.name))


def stored_kind(ggml_type: int) -> str | None:
    """'int4', 'int5' or 'int8': the kernels' kind that holds this type's values closest; None for a
    float type."""
    if ggml_type in FLOAT_TYPES:
        return None
    if ggml_type in (Q5_0, Q5_1, Q5_K):
        return "int5"
    name = type_name(ggml_type)
    if name.startswith(_INT8_NAMES):
        return "int8"
    return "int4" if name.startswith(_INT4_NAMES) else "int8"


# The types gguf_repack.cpp reads straight into each kind's buffers, with the same values: int4 as
# Q4_0 (step d, minimum -8 d), Q4_1 (d, m) and Q4_K (d sc and -dmin m rounded to float16); int5 as
# those and Q5_0 (levels q, step d, minimum -16 d), Q5_1 (d, m) and Q5_K (as Q4_K); int8 as Q8_0 (d)
# and Q5_0 (levels q - 16, step d).
REPACKED = {"int4": (Q4_0, Q4_1, Q4_K), "int5": (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K), "int8": (Q8_0, Q5_0)}
# The types gguf_repack.cpp requantizes into each kind's buffers: gguf's dequantized values, quantized
# as `_quantize` does, bit for bit (Q4_K_M files' Q6_K layers, Q3_K_M and Q2_K files' 2- and 3-bit
# layers, an int8 model's Q4/Q5 layers where a fused group holds them with an int8 sibling).
REQUANTIZED = {
    "int4": (Q2_K, Q3_K),
    "int5": (Q2_K, Q3_K),
    "int8": (Q4_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K),
}


def dequantized(ggml_type: int, raw: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """The tensor's values as (rows, columns) float32, through gguf's own dequantize."""
    from gguf.quants import dequantize

    if ggml_type == F32:
        return raw.view(torch.float32).reshape(rows, columns)
    if ggml_type == F16:
        return raw.view(torch.float16).reshape(rows, columns).float()
    if ggml_type == BF16:
        return raw.view(torch.bfloat16).reshape(rows, columns).float()
    values = dequantize(raw.numpy().reshape(rows, -1), ggml_type)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(rows, columns)
