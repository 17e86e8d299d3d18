"""Models: resolve a MODEL argument (packaged, GGUF, checkpoint directory, cached hub id), resolve the
device, dtype and weights mode (runtime.py), load model and tokenizer.

The names below load their modules on first use: the command line's --help never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy_names import lazy_names

if TYPE_CHECKING:
    from .cpu import cpu_isa
    from .device import device_name, dtype_name, pick_device, pick_dtype
    from .load import LoadedModel, context_limit, load_model, load_prompt_side, load_tokenizer
    from .resolve import DEFAULT_MODEL, ModelSource, resolve_model
    from .runtime import Runtime
    from .weights_mode import DENSE, WeightsMode

_HOMES = {
    "cpu_isa": ".cpu",
    "device_name": ".device",
    "dtype_name": ".device",
    "pick_device": ".device",
    "pick_dtype": ".device",
    "LoadedModel": ".load",
    "context_limit": ".load",
    "load_model": ".load",
    "load_prompt_side": ".load",
    "load_tokenizer": ".load",
    "DEFAULT_MODEL": ".resolve",
    "ModelSource": ".resolve",
    "resolve_model": ".resolve",
    "DENSE": ".weights_mode",
    "Runtime": ".runtime",
    "WeightsMode": ".weights_mode",
}

__all__ = [
    "DEFAULT_MODEL",
    "DENSE",
    "LoadedModel",
    "ModelSource",
    "Runtime",
    "WeightsMode",
    "context_limit",
    "cpu_isa",
    "device_name",
    "dtype_name",
    "load_model",
    "load_prompt_side",
    "load_tokenizer",
    "pick_device",
    "pick_dtype",
    "resolve_model",
]


__getattr__ = lazy_names(__name__, _HOMES)
