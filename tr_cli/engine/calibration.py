"""t(N) of this device and model, measured once and then read from the store's calibration cache."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

import torch
import transformers

from ..core import TokenRecyclingDecoder
from ..core.design.cost_model import CostModel
from ..errors import StoreError
from ..models import device_name, native_kernels
from ..models.weights import weights_mode
from ..store.calibration import read_calibration, write_calibration
from .cpu_load import OtherLoad

# 2: the key is the model's shape (class, config without paths or identity, attention), no longer
# its id and whole config, so a model moved or loaded from another directory is not measured again.
# 3: and the forward path (core/forward.py): the direct Llama-family path costs less per step.
# 4: multi-token steps cost less (core/forward.grouped_sdpa), and `+bf16` weights time their steps
# on the quantized path (core/step_scope.py).
# 5: models on tr's kernels run fused layers, all layers in one call (models/fused_layers.py): a
# one-token int4 step on SmolLM2 went from ~20 to ~13 ms, and the trees follow the costs.
# 6: tr's kernels take weights in blocks of eight columns and the row attention reads keys in blocks:
# each extra row of a step costs about half what it did.
# 7: each size priced by its median ratio to a one-token step timed just before it (cost_model.calibrate).
CALIBRATION_VERSION = 7
# Other processes' CPU use during a measurement above which it is not cached. Measured here: one
# competing torch process cut one-token decoding from 14.0 to 5.2 tok/s (benchmarks/contention_bench.py).
BUSY_CORES = 0.5

# Config fields that say where a model came from or what it is called, not what a step computes:
# its paths (`_name_or_path`; a GGUF's `_model_name_or_path` is its name), the classes and dtype it
# was saved with (the running class and dtype go in the key themselves), the transformers that
# wrote it (the running one does), labels and special-token ids.
_NOT_SHAPE = re.compile(
    r".*name_or_path|architectures|dtype|torch_dtype|transformers_version|id2label|label2id|.*_token_ids?"
)


def model_shape(model: torch.nn.Module) -> dict:
    """What a step's cost depends on in the model: its class, its config without paths and
    identity (sizes, layers, attention layout, rope, quantization...), its attention kernel and
    tr's own weight quantization (its weights mode)."""
    config = model.config
    if hasattr(config, "to_json_string"):
        fields = _without_identity(json.loads(config.to_json_string(use_diff=False)))
    else:
        fields = str(config)
    shape = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "config": fields,
        "attention": getattr(config, "_attn_implementation", None),
    }
    weights = weights_mode(model)
    if not weights.dense:  # only then, so that dense models keep their cached measurements
        shape["weights"] = weights.name
    return shape


def _without_identity(value: object) -> object:
    """`value` with the _NOT_SHAPE fields dropped at every depth (a multimodal model's text and
    vision configs carry their own)."""
    if isinstance(value, dict):
        return {k: _without_identity(v) for k, v in value.items() if not _NOT_SHAPE.fullmatch(str(k))}
    if isinstance(value, list):
        return [_without_identity(v) for v in value]
    return value


def calibration_key(
    model: torch.nn.Module, device: torch.device, dtype: torch.dtype, k: int, forward: str = "model"
) -> str:
    """Everything t(N) depends on: device model, threads, torch and transformers versions, the
    model's shape, dtype, k and the forward path. Not the model's id or where its files are: the
    same shape loaded from anywhere (a new TR_HOME, a copied checkpoint) reads the same measurement.
    Where tr's kernels are loaded, also their build (source and instruction sets: TR_KERNELS=avx2 on
    an AVX512-VNNI CPU is another cost curve)."""
    shape = json.dumps(model_shape(model), sort_keys=True)
    parts = [
        str(CALIBRATION_VERSION),
        device.type,
        device_name(device),
        str(torch.get_num_threads()),
        torch.__version__,
        transformers.__version__,
        hashlib.sha256(shape.encode()).hexdigest(),
        str(dtype),
        str(k),
        forward,
        native_kernels.build_id() or "",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def load_or_calibrate(
    decoder: TokenRecyclingDecoder,
    model_id: str,
    status: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    busy_cores: float = BUSY_CORES,
) -> CostModel:
    """The cached t(N) of this device and model, measured now (seconds to minutes) when missing or
    unreadable. A cache that cannot be written goes to `warn` (to `status` without one): the
    measurement is used for this run all the same; so is one taken while other processes kept
    more than `busy_cores` cores busy, which is not cached. `model_id` is only recorded in the file."""
    say = status or (lambda message: None)
    dtype = next(decoder.model.parameters()).dtype
    key = calibration_key(decoder.model, decoder.device, dtype, decoder.k, decoder.forward_pass.name)
    try:
        cost = read_calibration(key)
        if cost is not None:
            return cost
        say("Measuring step cost t(N) on this device (once per model and device)")
    except StoreError as exc:  # overwritten below by a good measurement
        say(f"{exc}; measuring step cost t(N) again")
    with OtherLoad() as load:
        cost = decoder.measure_cost()
    if load.cores is not None and load.cores > busy_cores:
        (warn or say)(
            f"other processes kept {load.cores:.1f} cores busy while t(N) was measured: it is used for this run "
            "but not cached (it would mis-size later trees); it is measured again on the next run"
        )
        return cost
    try:
        write_calibration(
            key,
            cost,
            {
                "device": device_name(decoder.device),
                "model": model_id,
                "dtype": str(dtype),
                "threads": torch.get_num_threads(),
            },
        )
    except StoreError as exc:
        (warn or say)(str(exc))
    return cost
