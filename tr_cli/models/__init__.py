"""Models: resolve a MODEL argument (packaged, GGUF, checkpoint directory, cached hub id), pick the
device and dtype, load model and tokenizer."""

from .device import device_name, dtype_name, pick_device, pick_dtype
from .load import LoadedModel, context_limit, load_model, load_tokenizer
from .resolve import DEFAULT_MODEL, ModelSource, resolve_model

__all__ = [
    "DEFAULT_MODEL",
    "LoadedModel",
    "ModelSource",
    "context_limit",
    "device_name",
    "dtype_name",
    "load_model",
    "load_tokenizer",
    "pick_device",
    "pick_dtype",
    "resolve_model",
]
