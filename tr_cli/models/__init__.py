"""Models: resolve a MODEL argument (packaged, GGUF, checkpoint directory, cached hub id), resolve the
device, dtype and weights mode (runtime.py), load model and tokenizer."""

from .device import cpu_isa, device_name, dtype_name, pick_device, pick_dtype
from .load import LoadedModel, context_limit, load_model, load_prompt_side, load_tokenizer
from .resolve import DEFAULT_MODEL, ModelSource, resolve_model
from .runtime import DENSE, Runtime, WeightsMode

__all__ = [
    "DENSE",
    "DEFAULT_MODEL",
    "LoadedModel",
    "ModelSource",
    "context_limit",
    "cpu_isa",
    "device_name",
    "dtype_name",
    "load_model",
    "load_prompt_side",
    "load_tokenizer",
    "pick_device",
    "pick_dtype",
    "Runtime",
    "WeightsMode",
    "resolve_model",
]
