"""The decoding methods a bench compares, all on one model object in one process.

Every method gets the same input ids and returns its tokens, wall time and forward-step count,
so MAT is measured the same way for all: new tokens per decoding forward after the prefill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..core import StopCondition, TokenRecyclingDecoder
from ..core.events import StepTimings, mean_accepted_tokens
from ..core.sampling_config import SamplingConfig
from ..engine.choices import TreeChoice
from ..engine.engine import Engine
from ..errors import UserError
from ..models.weights import WEIGHTS

METHODS = ("baseline", "pld", "ar", "tr")
PLD_TOKENS = 10  # HF prompt lookup decoding's draft length, as peers run it
# `METHOD@int8`: the method on a quantized copy of the model (models/weights.py), in the same run.
VARIANT_WEIGHTS = tuple(w for w in WEIGHTS if w != "dense")


def split_weights(name: str) -> tuple[str, str | None]:
    """'tr:paper@int8' -> ('tr:paper', 'int8'); 'tr' -> ('tr', None)."""
    base, sep, weights = name.rpartition("@")
    return (base, weights) if sep else (name, None)


def counterpart(name: str, reference: str) -> str:
    """The `reference` method on the same weights as `name`: what its tokens are compared with
    ('baseline') and its speculation measured against ('ar')."""
    weights = split_weights(name)[1]
    return f"{reference}@{weights}" if weights else reference


@dataclass(frozen=True)
class Run:
    tokens: list[int]
    seconds: float
    steps: int  # decoding forward passes after the prefill
    timings: StepTimings | None = None  # our decoder's step time split (summed over steps)

    @property
    def step_tokens(self) -> int:
        """Tokens produced by decoding steps: the prefill's token is not a step's."""
        return max(len(self.tokens) - 1, 0)

    @property
    def mean_accepted_tokens(self) -> float:
        return mean_accepted_tokens(self.step_tokens, self.steps)


class _ForwardCounter:
    """Counts the model's top-level forward calls (a public nn.Module hook; nothing patched)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = model.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


class HFGenerate:
    """transformers `generate`, greedy or sampling; with `prompt_lookup` it is HF prompt lookup
    decoding. Sampling draws from torch's global generator (seeded once by the bench)."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        prompt_lookup: bool,
        sampling: SamplingConfig | None = None,
    ) -> None:
        self.model = model
        self.eos = eos_token_ids
        self.prompt_lookup = prompt_lookup
        self.sampling = sampling or SamplingConfig.greedy()

    @torch.inference_mode()
    def run(self, ids: list[int], max_new_tokens: int) -> Run:
        device = self.model.get_input_embeddings().weight.device
        prompt = torch.tensor([ids], device=device)
        extra = {"prompt_lookup_num_tokens": PLD_TOKENS} if self.prompt_lookup else {}
        counter = _ForwardCounter(self.model)
        try:
            start = time.perf_counter()
            out = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new_tokens,
                eos_token_id=self.eos or None,
                pad_token_id=self.eos[0] if self.eos else 0,
                **self.sampling.generate_kwargs(),
                **extra,
            )
            seconds = time.perf_counter() - start
        finally:
            counter.close()
        tokens = out[0, len(ids) :].tolist()
        return Run(tokens, seconds, max(counter.calls - 1, 0))


class TokenRecycling:
    """Our decoder (any tree, `none` for `ar`); every prompt starts a fresh conversation and the
    matrix carries over. A sampling config's random stream runs on across prompts (seeded once)."""

    def __init__(self, decoder: TokenRecyclingDecoder, eos_token_ids: list[int]) -> None:
        self.decoder = decoder
        self.eos = eos_token_ids

    def run(self, ids: list[int], max_new_tokens: int) -> Run:
        self.decoder.reset()
        result = self.decoder.generate(ids, StopCondition.build(max_new_tokens, self.eos))
        stats = result.stats
        return Run(result.tokens, stats.wall_seconds, stats.steps, stats.step_timings)


def parse_methods(names: list[str]) -> list[str]:
    """Known methods, plus `tr:TREE` variants (e.g. tr:paper, tr:auto, tr:none+lookup10), each
    optionally `@int8`/`@int4`; raises UserError naming the first unknown one."""
    for name in names:
        base, weights = split_weights(name)
        if base not in METHODS and not (base.startswith("tr:") and len(base) > 3):
            raise UserError(
                f"--methods: unknown method {name}; choose from {', '.join(METHODS)} or tr:TREE (e.g. tr:paper), "
                f"optionally @{'/@'.join(VARIANT_WEIGHTS)}"
            )
        if weights is not None and weights not in VARIANT_WEIGHTS:
            raise UserError(f"--methods {name}: unknown weights @{weights}; use @{' or @'.join(VARIANT_WEIGHTS)}")
    if len(set(names)) != len(names):
        raise UserError("--methods: a method is listed twice")
    if not names:
        raise UserError(f"--methods: no method given; choose from {', '.join(METHODS)}")
    return names


def variant_tree(name: str) -> tuple[str, int | None]:
    """'tr:paper' -> ('paper', None); 'tr:auto+lookup0' -> ('auto', 0)."""
    tree = name.split(":", 1)[1]
    if "+lookup" in tree:
        tree, _, length = tree.rpartition("+lookup")
        try:
            return tree, int(length)
        except ValueError:
            raise UserError(f"--methods {name}: the lookup length must be a number, e.g. tr:paper+lookup10") from None
    return tree, None


def make_runners(engine: Engine, methods: list[str], variants: dict[str, TreeChoice]) -> tuple[dict, dict[str, str]]:
    """Each method's runner, in the given order, and the drafts of our decoders. `tr` decodes on
    the engine's decoder (the store's matrix); `ar`, `tr:TREE` and `@WEIGHTS` variants on copies
    of the matrix, so they neither help one another nor change the store; `@WEIGHTS` ones on the
    engine's quantized copy of the model."""
    runners, drafts = {}, {}
    eos = engine.loaded.eos_token_ids
    for name in methods:
        base, weights = split_weights(name)
        model = engine.loaded.model if weights is None else engine.quantized_model(weights)
        if name == "tr" or name in variants:
            decoder = engine.decoder if name == "tr" else engine.make_decoder(variants[name], fork=True, model=model)
            runners[name] = TokenRecycling(decoder, eos).run
            drafts[name] = decoder.describe()
        else:
            runners[name] = HFGenerate(model, eos, prompt_lookup=base == "pld", sampling=engine.sampling).run
    return runners, drafts
