"""Engine: the set-up every decoding command shares, built in one order and described in one banner."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core import TokenRecyclingDecoder
from ..core.decode import PrefillLearning
from ..core.drafters.plan import DraftPlan
from ..core.sampling_config import SamplingConfig, SamplingRequest, ignored_generation_settings
from ..errors import SettingError, first_line
from ..models import LoadedModel, WeightsMode, load_model, native_kernels
from ..models.device import device_name, dtype_name
from ..models.load import kernels_dir
from ..models.progress import Status, quiet
from ..models.runtime import NATIVE_DTYPE, Runtime
from ..models.weights import quantized_copy
from ..store.hot_matrix import HotMatrix, Saved
from ..store.paths import cache_dir
from .calibration import load_or_calibrate
from .options import DecodingOptions

# The decoders tr runs give the matrix only the prefill rows it computes anyway (each chunk's last):
# learning from every prompt token computes the head and its top-k for each (a quarter to a third
# of a prefill's work), where a hot matrix gains little from it. Measured on a 2-core Zen 1 (AVX2),
# own prompts, 128 tokens, a hot matrix, every row against none: the 0.5B Qwen2 31 % less prefill
# time for MAT 1.467 -> 1.435 (+14 % tokens a second, prefill included), SmolLM2 24 % less for
# 1.419 -> 1.409 (+11 %). `tr matrix init` still prefills every row into the matrix: its job.
PREFILL_LEARNING = PrefillLearning.COMPUTED_ROWS


def resolve_sampling(request: SamplingRequest, loaded: LoadedModel) -> tuple[SamplingConfig, list[str]]:
    """The request merged with the model's generation config (and transformers' defaults), as
    generate(do_sample=True) would merge them, and warnings for what tr cannot apply."""
    if not request.wants_sampling:
        return SamplingConfig.greedy(), []
    generation_config = getattr(loaded.model, "generation_config", None)
    warnings = []
    ignored = ignored_generation_settings(generation_config)
    if ignored:
        warnings.append(
            f"the model's generation config sets {', '.join(ignored)}, which tr does not apply when sampling"
        )
    return request.resolve(generation_config), warnings


def dtype_unavailable(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why `device` cannot compute in `dtype`, in a few words, or None. A GPU that only emulates
    bfloat16 counts as without it: a reference timed on emulation is not the one its users run."""
    if device.type == "cpu":  # every dtype runs; the report's cpu_isa says whether natively
        return None
    if device.type == "cuda":
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported(including_emulation=False):
            return f"the {device_name(device)} has no native bfloat16"
        return None
    try:  # other accelerators (mps): a small matmul says
        ones = torch.ones(2, 2, dtype=dtype, device=device)
        ones @ ones
    except (TypeError, RuntimeError) as exc:
        return f"{device.type} cannot compute in {dtype_name(dtype)} ({first_line(exc)})"
    return None


@dataclass
class Engine:
    """A loaded model, its hot matrix and (unless asked not to) the decoder the options describe."""

    loaded: LoadedModel
    sampling: SamplingConfig
    hot: HotMatrix | None = None
    decoder: TokenRecyclingDecoder | None = None
    warnings: list[str] = field(default_factory=list)  # to show the user once, before decoding
    status: Status = quiet
    warn: Status | None = None  # warnings after set-up (a later calibration's failed save)
    _quantized: dict[WeightsMode, torch.nn.Module] = field(default_factory=dict)  # quantized_model's copies
    _dense: dict[torch.dtype, LoadedModel] = field(default_factory=dict)  # dense_load's loads

    @classmethod
    def open(
        cls,
        options: DecodingOptions,
        status: Status = quiet,
        matrix: bool = True,
        decoder: bool = True,
        phase: Status = quiet,
    ) -> Engine:
        """Load the model, open its matrix (`matrix`) and build the decoder (`decoder`, which
        needs the matrix; a designed tree calibrates t(N) once per model and device). `phase`
        hears each step's name as it begins, shown or not (a start's timing)."""
        phase("loading the model")
        loaded = load_model(options.model, options.runtime, status=status, cache=cache_dir())
        sampling, warnings = resolve_sampling(options.sampling, loaded)
        engine = cls(loaded, sampling, warnings=warnings, status=status)
        if matrix or decoder:
            phase("opening the matrix and the recycled store")
            engine.hot = HotMatrix.open(
                loaded.tokenizer,
                loaded.vocab_size,
                loaded.model_id,
                k=options.k,
                device=loaded.runtime.device,
                path=options.matrix,
                cold=options.cold,
                save=options.save,
            )
            engine.warnings += engine.hot.warnings
        if decoder:
            phase("building the decoder (t(N) read or measured)")
            engine.decoder = engine.make_decoder(options.drafts)
        return engine

    def make_decoder(
        self, plan: DraftPlan, fork: bool = False, model: torch.nn.Module | None = None
    ) -> TokenRecyclingDecoder:
        """A decoder drafting as `plan` says on the hot matrix, or (`fork`) on a copy of it that is
        never saved, so that variants neither help one another nor change the recycled store.
        `model`: another copy of the loaded one (quantized_model)."""
        hot = self.hot.fork() if fork else self.hot
        return TokenRecyclingDecoder(
            self.loaded.model if model is None else model,
            matrix=hot.matrix,
            tree=plan.tree,
            acceptance=hot.acceptance,
            drafters=plan.drafters(self.loaded.runtime.device, hot.store),
            sampling=self.sampling,
            prefill_learning=PREFILL_LEARNING,
            # A designed tree: t(N) read from the calibration cache, or measured with the decoder.
            cost=lambda decoder: load_or_calibrate(
                decoder, self.loaded.model_id, status=self.status, warn=self.warn or self.warnings.append
            ),
        )

    def quantized_model(self, weights: WeightsMode) -> torch.nn.Module:
        """The loaded model with `weights` matmuls (models/weights.py), made once and kept, sharing
        the loaded model's other tensors: what `tr bench`'s METHOD@int8 variants run on."""
        if not self.loaded.runtime.weights.dense:
            raise SettingError(
                "weights",
                self.loaded.runtime.weights,
                f"{weights} variants are made from the dense model; load it dense",
            )
        if weights not in self._quantized:
            if self.loaded.runtime.dtype == NATIVE_DTYPE:
                native_kernels.load(kernels_dir(cache_dir()), self.status)
            self.status(f"Quantizing a copy of {self.loaded.model_id}'s weights to {weights}")
            self._quantized[weights] = quantized_copy(self.loaded.model, weights).eval()
        return self._quantized[weights]

    def dense_load(self, dtype: torch.dtype) -> LoadedModel:
        """The model file loaded again, dense in `dtype` on the same device, once (the converted
        checkpoint is cached, so in about a second): what `tr bench`'s METHOD@bf16 variants run
        on, transformers on the weights most people run, whatever this engine loaded. The loaded
        model itself where it is already dense in `dtype`. SettingError where the device cannot
        compute in `dtype`."""
        runtime = self.loaded.runtime
        if runtime.weights.dense and runtime.dtype == dtype:
            return self.loaded
        if dtype not in self._dense:
            why = dtype_unavailable(dtype, runtime.device)
            if why is not None:
                raise SettingError("dtype", dtype_name(dtype), why)
            source = self.loaded.source
            argument = str(source.path) if source.path is not None else source.model_id
            self._dense[dtype] = load_model(argument, Runtime(runtime.device, dtype), self.status, cache=cache_dir())
        return self._dense[dtype]

    def save(self, end_conversation: bool = True) -> Saved:
        """Write the hot state back (matrix, store, statistics; nothing when saving is off). With
        `end_conversation` the decoder's conversation ends first, which is what adds it to the
        store; a periodic save during a chat keeps it going (it joins at a later save)."""
        if self.hot is None:
            return Saved()
        if end_conversation and self.decoder is not None:
            self.decoder.reset()
        return self.hot.save()

    def banner(self) -> list[str]:
        """What runs, in two lines: the model and how it decodes; the matrix."""
        loaded = self.loaded
        parts = [
            loaded.model_id,
            loaded.runtime.describe(),
            str(loaded.runtime.device),
            f"{torch.get_num_threads()} threads",
        ]
        if self.decoder is not None:
            parts += [self.decoder.describe(), self.decoder.sampling.describe()]
        else:
            parts.append(self.sampling.describe())
        lines = [" · ".join(parts)]
        if self.hot is not None:
            lines.append(self.hot.describe())
        return lines
