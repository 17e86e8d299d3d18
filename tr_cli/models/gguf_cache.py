"""GGUF files as transformers checkpoints: dequantized once, cached by the file's SHA-256."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from .gguf_header import file_sha256
from .progress import Status

# Dequantized GGUF checkpoints are cached in float32 up to this size (exact for every quant
# format), in bfloat16 above it to keep the cache small.
_FP32_CACHE_MAX_PARAMS = 2_000_000_000


def _save_plain_checkpoint(model: torch.nn.Module, directory: Path) -> None:
    """Weights (safetensors), config and generation config, without the GGUF quantizer marker
    (transformers refuses save_pretrained on a model loaded from GGUF)."""
    from safetensors.torch import save_model

    save_model(model, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)


def gguf_checkpoint(path: Path, root: Path, status: Status) -> Path:
    """A transformers checkpoint converted from the GGUF, cached under `root` by the file's hash."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    status(f"Hashing {path.name}")
    digest = file_sha256(path, root / "hashes.json")
    target = root / digest[:32]
    if (target / "config.json").is_file():
        return target
    status(f"Converting {path.name} to a transformers checkpoint (first load only, cached afterwards)")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    if model.num_parameters() > _FP32_CACHE_MAX_PARAMS:
        model = model.to(torch.bfloat16)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=root))
    try:
        _save_plain_checkpoint(model, tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{path.resolve()}\nsha256 {digest}\n")
        try:
            os.rename(tmp, target)  # atomic: a reader sees no checkpoint or a whole one
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
