"""The decoding methods a bench compares, all on one model object in one process.

Every method gets the same input ids and returns its tokens, wall time and forward-step count,
so MAT is measured the same way for all: new tokens per decoding forward after the prefill.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..core import PRESETS, StepEvent, StopCondition, TokenRecyclingDecoder
from ..core.drafters.plan import DraftPlan
from ..core.sampling_config import SamplingConfig
from ..engine.engine import Engine, dtype_unavailable
from ..engine.options import draft_plan
from ..errors import SettingError
from ..models.device import dtype_name
from ..models.weights_mode import QUANTIZED_MODES, WeightsMode
from .llama_cpp import LLAMA_CPP_METHODS, LLAMA_CPP_NGRAM, LlamaCpp, LlamaServer, check_available
from .run import Run

if TYPE_CHECKING:
    from ..core.constraint import TokenConstraint
    from ..text.grammar import Grammar

# A fresh constraint for a grammar, in its initial state (structured prompts).
ConstraintOf = Callable[["Grammar"], "TokenConstraint"]

METHODS = ("baseline", "pld", "ar", "tr", *LLAMA_CPP_METHODS)
PLD_TOKENS = 10  # HF prompt lookup decoding's draft length, as peers run it
# `ar`: our forward, one token per step (no drafts): what speculation alone adds.
ONE_TOKEN = DraftPlan.of(PRESETS["none"])


@dataclass(frozen=True)
class DenseLoad:
    """A method's `@bf16`: the model file loaded again, dense in `dtype` (Engine.dense_load),
    whatever the bench itself loaded: `baseline@bf16` is transformers as most people run it."""

    suffix: str  # as a method name spells it
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.suffix


BF16 = DenseLoad("bf16", torch.bfloat16)
# What may follow a method's `@`: a quantized copy of the loaded model, or the file loaded again.
VARIANT_NAMES = (*(mode.name for mode in QUANTIZED_MODES), BF16.suffix)
VARIANTS_IN_WORDS = (
    f"@{', @'.join(mode.name for mode in QUANTIZED_MODES)} (a quantized copy of the loaded model) "
    f"or @{BF16} (the model file loaded again, dense {dtype_name(BF16.dtype)})"
)
Variant = WeightsMode | DenseLoad


def parse_variant(text: str) -> Variant:
    """What follows a method's `@`: 'int8', 'int4+bf16'... or 'bf16'."""
    if text == BF16.suffix:
        return BF16
    if text not in VARIANT_NAMES:  # `dense` too: the method without `@` runs on the loaded weights
        raise SettingError(
            "weights", text, f"{'not a variant' if text == 'dense' else 'unknown'}; use {VARIANTS_IN_WORDS}"
        )
    return WeightsMode.parse(text)


def split_weights(name: str) -> tuple[str, str | None]:
    """'tr:paper@int8' -> ('tr:paper', 'int8'); 'tr' -> ('tr', None)."""
    base, sep, weights = name.rpartition("@")
    return (base, weights) if sep else (name, None)


def counterpart(name: str, reference: str) -> str | None:
    """The `reference` method on the same weights as `name`: what its tokens are compared with
    ('baseline') and its speculation measured against ('ar'). `baseline@W` is its own reference,
    as `baseline` is: different weights give different tokens."""
    base, weights = split_weights(name)
    if base in LLAMA_CPP_METHODS:  # its own weights and kernels: nothing of ours to compare with
        return None
    return f"{reference}@{weights}" if weights else reference


def speedup_reference(names: Iterable[str]) -> str | None:
    """The method every speedup is over: `baseline` where it ran, else the first `baseline@W`
    (`baseline@bf16,ar,tr`: ar and tr over transformers on dense bfloat16); None: neither ran."""
    names = list(names)
    if "baseline" in names:
        return "baseline"
    return next((name for name in names if split_weights(name)[0] == "baseline"), None)


class _ForwardCounter:
    """Counts the model's top-level forward calls (a public nn.Module hook; nothing patched)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = model.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


class _FirstToken:
    """A `generate` streamer (transformers' public hook) that notes when the first new token
    arrives: generate hands it the prompt first, then each new token. Assisted decoding (prompt
    lookup) hands over its first verification's tokens at once, the prefill inside it: no time
    of its own for the first token then (None)."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.seconds: float | None = None
        self._puts = 0

    def put(self, value) -> None:
        self._puts += 1
        if self._puts == 2 and value.numel() == 1:
            self.seconds = time.perf_counter() - self.start

    def end(self) -> None:
        pass


class HFGenerate:
    """transformers `generate`, greedy or sampling; with `prompt_lookup` it is HF prompt lookup
    decoding. Sampling draws from torch's global generator (seeded once by the bench)."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        prompt_lookup: bool,
        sampling: SamplingConfig | None = None,
        constraint_of: ConstraintOf | None = None,
    ) -> None:
        self.model = model
        self.eos = eos_token_ids
        self.prompt_lookup = prompt_lookup
        self.sampling = sampling or SamplingConfig.greedy()
        self.constraint_of = constraint_of

    @torch.inference_mode()
    def run(self, ids: list[int], max_new_tokens: int, grammar: Grammar | None = None) -> Run:
        device = self.model.get_input_embeddings().weight.device
        prompt = torch.tensor([ids], device=device)
        extra = {"prompt_lookup_num_tokens": PLD_TOKENS} if self.prompt_lookup else {}
        if grammar is not None:  # the same grammar as tr's, as a logits processor
            from ..text.grammar_logits import GrammarLogitsProcessor

            extra["logits_processor"] = [GrammarLogitsProcessor(self.constraint_of(grammar), len(ids))]
        counter = _ForwardCounter(self.model)
        try:
            start = time.perf_counter()
            first = _FirstToken(start)
            out = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new_tokens,
                eos_token_id=self.eos or None,
                pad_token_id=self.eos[0] if self.eos else 0,
                **self.sampling.generate_kwargs(),
                **extra,
                streamer=first,
            )
            seconds = time.perf_counter() - start
        finally:
            counter.close()
        tokens = out[0, len(ids) :].tolist()
        steps = max(counter.calls - 1, 0)
        # Plain generate emits one token per forward; prompt lookup does not say how many.
        per_step = None if self.prompt_lookup else Counter({1: steps})
        return Run(tokens, seconds, steps, tokens_per_step=per_step, first_token_seconds=first.seconds)


class TokenRecycling:
    """Our decoder (any tree, `none` for `ar`); every prompt starts a fresh conversation and the
    matrix carries over. A sampling config's random stream runs on across prompts (seeded once)."""

    def __init__(
        self, decoder: TokenRecyclingDecoder, eos_token_ids: list[int], constraint_of: ConstraintOf | None = None
    ) -> None:
        self.decoder = decoder
        self.eos = eos_token_ids
        self.constraint_of = constraint_of

    def run(self, ids: list[int], max_new_tokens: int, grammar: Grammar | None = None) -> Run:
        self.decoder.reset()
        self.decoder.set_constraint(self.constraint_of(grammar) if grammar is not None else None)
        try:
            result = self.decoder.generate(ids, StopCondition.build(max_new_tokens, self.eos), keep_events=True)
        finally:
            self.decoder.set_constraint(None)
        stats = result.stats
        per_step = Counter(len(event.new_tokens) for event in result.events if event.step > 0)
        drafted = sum((Counter(event.accepted_by_source) for event in result.events), Counter())
        verified = sum((_verified_by_source(event) for event in result.events), Counter())
        first = stats.first_token_seconds
        return Run(
            result.tokens, stats.wall_seconds, stats.steps, stats.step_timings, per_step, drafted, verified, first
        )


def _verified_by_source(event: StepEvent) -> Counter[str]:
    """The draft nodes a step verified, by source (a node two sources proposed counts for both)."""
    return Counter({name: sum(1 for node in nodes if node > 0) for name, nodes in event.nodes_by_source.items()})


@dataclass(frozen=True)
class Method:
    """One method of a bench, parsed from its name: `tr`, `ar`, `tr:PLAN` (drafts as
    drafters/plan.py reads them), `baseline` or `pld`, each optionally `@WEIGHTS` (a variant)."""

    name: str
    plan: DraftPlan | None  # our decoder's drafts; None: transformers' generate (or llama.cpp)
    # None: the loaded model; a WeightsMode: a quantized copy of it; a DenseLoad: the file loaded again
    weights: Variant | None = None

    @property
    def llama_cpp(self) -> bool:
        """llama.cpp on the model's GGUF file (bench/llama_cpp.py), not one of our decoders."""
        return self.name in LLAMA_CPP_METHODS

    @property
    def prompt_lookup(self) -> bool:
        return split_weights(self.name)[0] == "pld"

    @property
    def on_engine_decoder(self) -> bool:
        """`tr` decodes on the engine's own decoder (the stored matrix); the others on copies."""
        return self.name == "tr"

    @classmethod
    def parse(cls, name: str, plan: DraftPlan, k: int) -> Method:
        """`name` as a method; `plan` is what `tr` drafts (the command's tree and sources)."""
        base, weights_name = split_weights(name)
        if name in LLAMA_CPP_METHODS:
            check_available(name)
            return cls(name, None)
        if base in LLAMA_CPP_METHODS:
            raise SettingError("methods", name, f"{base} runs the GGUF file on its own kernels; it takes no @variant")
        try:
            weights = None if weights_name is None else parse_variant(weights_name)
            if base in ("baseline", "pld"):
                return cls(name, None, weights)
            if base == "ar":
                return cls(name, ONE_TOKEN, weights)
            if base == "tr":
                return cls(name, plan, weights)
            if base.startswith("tr:") and len(base) > 3:
                return cls(name, draft_plan(base[3:], k), weights)
        except SettingError as exc:
            raise SettingError("methods", name, f"{exc.setting} {exc.value}: {exc.reason}") from None
        raise SettingError(
            "methods",
            name,
            f"unknown method; choose from {', '.join(METHODS)} or tr:TREE (e.g. tr:paper, tr:auto+lookup0), "
            f"optionally @{'/@'.join(VARIANT_NAMES)}",
        )


def parse_methods(names: list[str], plan: DraftPlan, k: int) -> list[Method]:
    """The methods named, in order; SettingError names the first that is unknown."""
    if not names:
        raise SettingError("methods", "''", f"no method given; choose from {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise SettingError("methods", ",".join(names), "a method is listed twice")
    return [Method.parse(name, plan, k) for name in names]


def check_device(methods: list[Method], device: torch.device) -> None:
    """Refuse, before anything loads, a method whose dense load `device` cannot compute in."""
    for method in methods:
        if isinstance(method.weights, DenseLoad):
            why = dtype_unavailable(method.weights.dtype, device)
            if why is not None:
                raise SettingError(
                    "methods",
                    method.name,
                    f"runs on the model loaded in {dtype_name(method.weights.dtype)}, and {why}; "
                    "drop it or use the cpu device",
                )


def make_runners(engine: Engine, methods: list[Method]) -> tuple[dict, dict[str, str]]:
    """Each method's runner, in the given order, and the drafts of our decoders. `tr` decodes on
    the engine's decoder (the stored matrix); `ar`, `tr:PLAN` and `@WEIGHTS` variants on copies
    of the matrix, so they neither help one another nor change the recycled store; `@WEIGHTS`
    ones on the engine's quantized copy of the model, `@bf16` ones on its dense bfloat16 load."""
    runners, drafts = {}, {}
    eos = engine.loaded.eos_token_ids
    constraint_of = _constraints(engine)
    for method in methods:
        if method.llama_cpp:
            runners[method.name] = _llama_cpp(engine, method.name).run
            continue
        model = model_of(engine, method)
        if method.plan is not None:
            decoder = (
                engine.decoder if method.on_engine_decoder else engine.make_decoder(method.plan, fork=True, model=model)
            )
            runners[method.name] = TokenRecycling(decoder, eos, constraint_of).run
            drafts[method.name] = decoder.describe()
        else:
            runners[method.name] = HFGenerate(
                model, eos, prompt_lookup=method.prompt_lookup, sampling=engine.sampling, constraint_of=constraint_of
            ).run
    return runners, drafts


def _constraints(engine: Engine) -> ConstraintOf:
    """Constraints for structured prompts, from one grammar compiler built on first use."""
    from ..text.schema_option import grammar_constraints

    loaded = engine.loaded
    return grammar_constraints(
        loaded.tokenizer, loaded.model, loaded.eos_token_ids, "structured prompts cannot be benchmarked on this model"
    )


def model_of(engine: Engine, method: Method) -> torch.nn.Module:
    """The model a method runs on: the loaded one, its quantized copy, or a dense load apart."""
    if method.weights is None:
        return engine.loaded.model
    if isinstance(method.weights, DenseLoad):
        return engine.dense_load(method.weights.dtype).model
    return engine.quantized_model(method.weights)


def variant_loads(engine: Engine, methods: list[Method]) -> dict[str, dict] | None:
    """What each `@bf16`-like variant ran on, for the report's environment (the loaded model's
    own dtype and weights are recorded beside it): dtype, weights, and whether it was a second
    load or the bench's own (already dense in that dtype). None: no such variant ran."""
    loads = {}
    for load in dict.fromkeys(m.weights for m in methods if isinstance(m.weights, DenseLoad)):
        loaded = engine.dense_load(load.dtype)
        runtime = loaded.runtime
        loads[load.suffix] = {
            "dtype": runtime.dtype_name,
            "weights": runtime.weights.name,
            "second_load": loaded is not engine.loaded,
        }
    return loads or None


def _llama_cpp(engine: Engine, name: str) -> LlamaCpp | LlamaServer:
    """llama.cpp over the loaded model's own GGUF file, greedy (its sampler is not ours)."""
    source = engine.loaded.source
    if source.kind != "gguf":
        raise SettingError("methods", name, f"runs a GGUF file; {source.model_id} is not one")
    if not engine.sampling.is_greedy:
        raise SettingError("methods", name, "is compared greedy only; drop the sampling settings")
    kind = LlamaServer if name == LLAMA_CPP_NGRAM else LlamaCpp
    return kind(source.path, engine.loaded.eos_token_ids, engine.loaded.context_length or 4096)
