"""GGUF files as transformers checkpoints: dequantized once, cached by the file's SHA-256."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from ..errors import ModelError, first_line
from .gguf_header import file_sha256, read_header
from .progress import Status

# Dequantized GGUF checkpoints are cached in float32 up to this size (exact for every quant
# format), in bfloat16 above it to keep the cache small.
_FP32_CACHE_MAX_PARAMS = 2_000_000_000
# Config, generation config and tokenizer files beside the weights: a few MB for any vocabulary.
_SIDE_FILES_BYTES = 32_000_000
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
_NO_ROOM = "free some space there, or point TR_HOME at a disk with more room"


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _space_needed(path: Path) -> tuple[int, str]:
    """Bytes the converted checkpoint takes, from the GGUF's parameter count, and its dtype."""
    params = read_header(path).n_parameters
    dtype = "float32" if params <= _FP32_CACHE_MAX_PARAMS else "bfloat16"
    return params * (4 if dtype == "float32" else 2) + _SIDE_FILES_BYTES, dtype


def _check_room(path: Path, root: Path) -> int:
    """Refuse before converting when `root` has no room for the checkpoint; returns the bytes needed."""
    needed, dtype = _space_needed(path)
    free = shutil.disk_usage(root).free
    if free < needed:
        raise ModelError(
            f"model {path.name}: not enough disk space to cache its converted checkpoint in {root}: needs about "
            f"{_megabytes(needed)} ({dtype}), {_megabytes(free)} free; {_NO_ROOM}"
        )
    return needed


def _tie_sources_only(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The state dict without the targets of the model's weight ties (lm_head.weight, tied to
    model.embed_tokens.weight), or None where tensors are shared otherwise. Loading, transformers
    reads each tie's source and points its targets at it; with the target saved instead (what
    safetensors' save_model keeps: the first name in sorted order) it fills the missing source
    with random values before tying it, at every start (0.15 s for SmolLM2's embedding)."""
    state = model.state_dict()
    expand = getattr(model, "get_expanded_tied_weights_keys", None)  # {target: source}
    for target, source in (expand(all_submodels=True) if expand else {}).items():
        if target in state and source in state and state[target].data_ptr() == state[source].data_ptr():
            del state[target]
    storages = {tensor.untyped_storage().data_ptr() for tensor in state.values()}
    return state if len(storages) == len(state) else None


def _save_plain_checkpoint(model: torch.nn.Module, directory: Path) -> None:
    """Weights (safetensors), config and generation config, without the GGUF quantizer marker
    (transformers refuses save_pretrained on a model loaded from GGUF)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file, save_model

    file, metadata = str(directory / "model.safetensors"), {"format": "pt"}
    state = _tie_sources_only(model)
    try:
        if state is None:  # shared tensors no tie explains: save_model picks the names to keep
            save_model(model, file, metadata=metadata)
        else:
            save_file({name: tensor.contiguous() for name, tensor in state.items()}, file, metadata=metadata)
    except SafetensorError as exc:
        # safetensors reports a failed write as its own error, the OS's in the text: "... (os error 28)"
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1]))) from exc
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)


_ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def _save_tokenizer(tokenizer, directory: Path) -> None:
    """The tokenizer's files, its added tokens listed in tokenizer_config.json as well. transformers
    leaves them out there for a tokenizers-backed tokenizer, and loading one without them parses
    the whole tokenizer.json in Python to find them (0.15 s of each SmolLM2 start)."""
    tokenizer.save_pretrained(directory)
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if "added_tokens_decoder" not in config:
        config["added_tokens_decoder"] = {
            str(index): {field: getattr(token, field) for field in _ADDED_TOKEN_FIELDS}
            for index, token in sorted(tokenizer.added_tokens_decoder.items())
        }
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def gguf_checkpoint(path: Path, root: Path, status: Status) -> Path:
    """A transformers checkpoint converted from the GGUF, cached under `root` by the file's hash."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = file_sha256(path, root / "hashes.json", hashing=lambda: status(f"Hashing {path.name}"))
    target = root / digest[:32]
    if (target / "config.json").is_file():
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"model {path.name}: cannot create the cache directory {root} ({exc.strerror})") from None
    needed = _check_room(path, root)
    status(f"Converting {path.name} to a transformers checkpoint (first load only, cached afterwards)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, KeyError, IndexError, TypeError, RuntimeError, NotImplementedError) as exc:
        # resolve_model checked the header; what is left is a file transformers reads and rejects
        raise ModelError(
            f"model {path.name}: transformers cannot convert this GGUF ({first_line(exc)}); "
            "pass another .gguf or the model's transformers checkpoint"
        ) from None
    if model.num_parameters() > _FP32_CACHE_MAX_PARAMS:
        model = model.to(torch.bfloat16)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=root))
        try:
            _save_plain_checkpoint(model, tmp)
            _save_tokenizer(tokenizer, tmp)
            (tmp / "SOURCE").write_text(f"{path.resolve()}\nsha256 {digest}\n")
            try:
                os.rename(tmp, target)  # atomic: a reader sees no checkpoint or a whole one
            except OSError:
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # the partial checkpoint, whatever stopped it
    except OSError as exc:
        if exc.errno in _FULL_DISK:
            raise ModelError(
                f"model {path.name}: the disk filled up while caching its converted checkpoint in {root} "
                f"(needs about {_megabytes(needed)}); {_NO_ROOM}"
            ) from None
        raise ModelError(
            f"model {path.name}: cannot write its converted checkpoint to {root} ({exc.strerror or exc}); "
            "make the directory writable, or point TR_HOME elsewhere"
        ) from None
    return target
