"""Load a resolved model and its tokenizer (eval mode, on the device, in the dtype), or only the
tokenizer and the matrix's row count, without the weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.bounded_cache import BoundedCache
from ..core.matrix import output_vocab_size
from ..errors import ModelError, first_line
from . import native_kernels
from .gguf_cache import gguf_side_files
from .gguf_load import load_gguf_model
from .progress import Status, quiet
from .resolve import ModelSource, resolve_model
from .runtime import NATIVE_DTYPE, Runtime
from .weights import quantize
from .weights_cache import cache_name, remembered
from .weights_mode import DENSE


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: ModelSource
    runtime: Runtime  # device, dtype and weights mode, as loaded

    @property
    def model_id(self) -> str:
        return self.source.model_id

    @property
    def vocab_size(self) -> int:
        """The matrix's rows: the output embedding's (core.matrix.output_vocab_size)."""
        return output_vocab_size(self.model)

    @property
    def context_length(self) -> int | None:
        return context_limit(self.model)

    @property
    def eos_token_ids(self) -> list[int]:
        """EOS ids as `model.generate` uses them (generation config first, tokenizer second)."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            return []
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def context_limit(model: torch.nn.Module) -> int | None:
    """The model's maximum positions, where the config states one."""
    return config_context_limit(getattr(model, "config", None))


def config_context_limit(config: object) -> int | None:
    """The maximum positions a model's config states (its text decoder's, for a multimodal one),
    or None: what context_limit reads, without the weights. A LongRoPE model (Phi-3.5, Phi-4-mini)
    stops at its pretraining context: past it transformers rotates with other frequencies and
    `generate` computes the whole sequence again, which a kept KV cache cannot follow."""
    try:
        config = config.get_text_config(decoder=True)
    except (AttributeError, TypeError):
        pass
    value = getattr(config, "max_position_embeddings", None)
    if not isinstance(value, int) or value <= 0:
        return None
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("rope_type") == "longrope":
        original = rope.get("original_max_position_embeddings")
        if isinstance(original, int) and 0 < original < value:
            return original
    return value


def _with_kernels(runtime: Runtime, cache: Path, status: Status) -> Runtime:
    """`runtime`, with tr's kernels built and loaded where its quantized mode runs on them, or on
    torch's kernels where they fail to build (said once through `status`)."""
    if runtime.weights.dense or runtime.dtype != NATIVE_DTYPE:
        return runtime
    try:
        native_kernels.load(kernels_dir(cache), status)
    except native_kernels.KernelBuildError as exc:
        status(f"{exc}; running torch's kernels in bfloat16 (slower trees)")
        return runtime.with_torch_kernels(first_line(exc))
    return runtime


def kernels_dir(cache: Path) -> Path:
    """Where tr's compiled kernels are kept under the cache dir (one folder per build)."""
    return cache / "kernels"


def _location(source: ModelSource, cache: Path, status: Status) -> str:
    """Where transformers loads this source's tokenizer and config from (a GGUF's are converted and
    cached first; its weights are read from the file itself)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # callers show their own progress through `status`
    if source.kind == "gguf":
        return str(gguf_side_files(source.path, cache / "gguf", status))
    if source.kind == "directory":
        return str(source.path)
    return source.model_id


def _output_rows(config) -> int:
    """The matrix's rows for a model not loaded: the same definition as for a loaded one, on the
    model built on the meta device (shapes only, no weights, no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return output_vocab_size(model)


def _output_rows_of(source: ModelSource, config) -> int:
    try:
        return _output_rows(config)
    except Exception as exc:  # noqa: BLE001 - any architecture's own checks: one line, not a traceback
        raise ModelError(
            f"model {source.model_id}: cannot build it to read its vocabulary ({first_line(exc)})"
        ) from None


# The files a tokenizer is saved as (fast, sentencepiece, BPE, WordPiece): a checkpoint directory
# with none of them has no tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _tokenizer_and_config(arg: str | None, cache: Path, status: Status) -> tuple[object, object, ModelSource]:
    from transformers import AutoConfig

    source = resolve_model(arg)
    location = _location(source, cache, status)
    if source.kind == "directory" and not any((source.path / name).exists() for name in _TOKENIZER_FILES):
        # transformers' own words: "Couldn't instantiate the backend tokenizer from one of: )"
        raise ModelError(
            f"model {source.model_id}: the directory has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); "
            "save the model's tokenizer beside its config.json, or pass the model's .gguf"
        )
    try:
        tokenizer = _tokenizer(source, location)
        config = AutoConfig.from_pretrained(location, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"model {source.model_id}: cannot load its tokenizer ({first_line(exc)})") from None
    return tokenizer, config, source


# A GGUF's tokenizers read in this process, by the folder of its converted side files: that folder
# is named by the file's SHA-256, so what it holds never changes under a name. `tr generate` reads
# the tokenizer to refuse a prompt past the context before the weights load, then loads the model:
# a 151,936-token vocabulary took 0.7 s of every start to read twice (2-core Zen 2).
_GGUF_TOKENIZERS: BoundedCache[object] = BoundedCache(4)


def _tokenizer(source: ModelSource, location: str):
    from transformers import AutoTokenizer

    def read():
        return AutoTokenizer.from_pretrained(location, local_files_only=True)

    return _GGUF_TOKENIZERS.get(location, read) if source.kind == "gguf" else read()


def load_tokenizer(arg: str | None, *, cache: Path, status: Status = quiet) -> tuple[object, int, ModelSource]:
    """Tokenizer, the matrix's row count and the source, without loading the weights. `cache`:
    where converted GGUF checkpoints are kept."""
    tokenizer, config, source = _tokenizer_and_config(arg, cache, status)
    return tokenizer, _output_rows_of(source, config), source


def load_prompt_side(arg: str | None, *, cache: Path, status: Status = quiet) -> tuple[object, int | None]:
    """The tokenizer and the context length (config_context_limit), without the weights (under a
    second): enough to refuse a prompt the context cannot hold before the model loads. `cache`:
    where converted GGUF checkpoints are kept."""
    tokenizer, config, _ = _tokenizer_and_config(arg, cache, status)
    return tokenizer, config_context_limit(config)


def load_model(
    arg: str | None,
    runtime: Runtime | None = None,
    status: Status = quiet,
    *,
    cache: Path,
) -> LoadedModel:
    """Resolve, then load model and tokenizer as `runtime` says (default: auto device and dtype,
    dense weights; eval mode), its matmul weights quantized unless they are dense. `cache`: where
    converted GGUF checkpoints and tr's compiled kernels are kept. A runtime on tr's kernels whose
    build fails here loads on torch's instead (bfloat16), saying why in `LoadedModel.runtime`."""
    runtime = runtime or Runtime.resolve()
    source = resolve_model(arg)
    runtime = _with_kernels(runtime, cache, status)
    torch_device, torch_dtype = runtime.device, runtime.dtype

    from transformers import AutoModelForCausalLM

    location = _location(source, cache, status)
    status(f"Loading {source.model_id} ({runtime.dtype_name}, {torch_device.type})")
    kwargs = dict(dtype=torch_dtype, local_files_only=True)
    if torch_device.type == "cuda":
        kwargs["device_map"] = "auto"  # spreads layers over GPUs (and CPU) when one GPU is too small
    try:
        tokenizer = _tokenizer(source, location)
        if source.kind == "gguf":
            model = _gguf_model(source, Path(location), runtime)
        else:
            try:
                model = AutoModelForCausalLM.from_pretrained(location, attn_implementation="sdpa", **kwargs)
            except ValueError as exc:  # an architecture without SDPA support: its own attention then
                if not any(word in str(exc).lower() for word in ("sdpa", "scaled_dot_product_attention")):
                    raise
                model = AutoModelForCausalLM.from_pretrained(location, attn_implementation="eager", **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"model {source.model_id}: cannot load it as a causal LM ({first_line(exc)})") from None
    if torch_device.type != "cuda" or source.kind == "gguf":
        model = model.to(torch_device)
    model.eval()
    if not runtime.weights.dense and not (source.kind == "gguf" and runtime.dtype == NATIVE_DTYPE):
        # a GGUF's quantized weights are not cached: the file is read at every start, nothing full-size kept
        checkpoint = source.path if source.kind == "gguf" else Path(location)
        _quantize(model, runtime, checkpoint, cache / "quantized", source.model_id, status)
    return LoadedModel(model, tokenizer, source, runtime)


def _gguf_model(source: ModelSource, side_files: Path, runtime: Runtime) -> torch.nn.Module:
    """The GGUF's model (gguf_load.py): on tr's kernels straight from the file's blocks, else
    dequantized in the run's dtype (quantized afterwards as a checkpoint is)."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(side_files, local_files_only=True)
    try:
        generation = GenerationConfig.from_pretrained(side_files, local_files_only=True)
    except OSError:
        generation = None
    weights = runtime.weights if runtime.dtype == NATIVE_DTYPE else DENSE
    return load_gguf_model(source.path, config, generation, weights, runtime.dtype)


def _quantize(model: torch.nn.Module, runtime: Runtime, location: Path, root: Path, name: str, status: Status) -> None:
    """Quantize as `runtime` says, taking the buffers an earlier start stored under `root` for
    this checkpoint and mode (weights_cache.py) where it can, and storing them where it cannot."""
    if not location.is_dir():  # not a local checkpoint directory: nothing to key a cache by
        status(f"Quantizing {name}'s weights to {runtime.weights}")
        quantize(model, runtime.weights)
        return
    code = (*native_kernels.SOURCES, *native_kernels.HEADERS)
    prefix, file_name = cache_name(location, str(runtime.weights), runtime.dtype_name, code)
    path = root / file_name
    try:
        stored = path.is_file()
        stale = [p for p in root.glob(f"{prefix}-*.safetensors") if p.name != file_name]
    except OSError:  # an unreadable cache dir: quantize, and try to keep nothing
        stored, stale = False, []
    status(
        f"Reading {name}'s {runtime.weights} weights, quantized at an earlier start"
        if stored
        else f"Quantizing {name}'s weights to {runtime.weights} (kept for later starts)"
    )
    with remembered(path, stale):
        quantize(model, runtime.weights)
