"""Sampling settings, merged the way `model.generate(do_sample=True)` merges them: what the caller
gives, else the model's generation config, else transformers' global defaults (top_k=50 among
them). Temperature 0 means greedy decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SettingError

# transformers' GenerationConfig._get_default_generation_params(): applied where neither the caller
# nor the model's generation config sets a value. top_k=50 applies even to models that never ask for
# it (SmolLM2's generation config sets none of these).
HF_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}

# Warpers `generate` would apply from a model's generation config that tr does not implement; a
# model setting one of them to an active value is reported (see ignored_generation_settings).
_UNSUPPORTED = {
    "typical_p": lambda v: v is not None and v < 1.0,
    "epsilon_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "eta_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "top_h": lambda v: v is not None,
}

SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes 0 .. 2**64 - 1


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings. temperature 0 means greedy decoding (the other fields are then unused);
    top_k 0 and top_p 1.0 switch those filters off; seed None draws a fresh seed."""

    temperature: float = HF_DEFAULTS["temperature"]
    top_k: int = HF_DEFAULTS["top_k"]
    top_p: float = HF_DEFAULTS["top_p"]
    repetition_penalty: float = HF_DEFAULTS["repetition_penalty"]
    seed: int | None = None
    min_p: float | None = None  # only from a model's generation config; no CLI option

    def __post_init__(self) -> None:
        _check(self.temperature, self.top_k, self.top_p, self.repetition_penalty, self.seed)
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise SettingError("min_p", self.min_p, "must be between 0 and 1")

    @classmethod
    def greedy(cls) -> SamplingConfig:
        return cls(temperature=0.0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def resolve(
        cls,
        generation_config: object | None = None,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
    ) -> SamplingConfig:
        """Given values win, then the model's generation config, then transformers' defaults:
        the settings `model.generate(do_sample=True, ...)` would sample with."""

        def pick(name: str, given):
            if given is not None:
                return given
            value = getattr(generation_config, name, None) if generation_config is not None else None
            return HF_DEFAULTS[name] if value is None else value

        min_p = getattr(generation_config, "min_p", None) if generation_config is not None else None
        return cls(
            temperature=float(pick("temperature", temperature)),
            top_k=int(pick("top_k", top_k)),
            top_p=float(pick("top_p", top_p)),
            repetition_penalty=float(pick("repetition_penalty", repetition_penalty)),
            seed=seed,
            min_p=None if min_p is None else float(min_p),
        )

    def generate_kwargs(self) -> dict:
        """Keyword arguments that make `model.generate` decode with these settings (greedy or sampled)."""
        if self.is_greedy:
            return {"do_sample": False}
        kwargs = {
            "do_sample": True,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
        }
        if self.min_p is not None:
            kwargs["min_p"] = self.min_p
        return kwargs

    def describe(self) -> str:
        if self.is_greedy:
            return "greedy"
        parts = [f"temperature {self.temperature:g}", f"top_p {self.top_p:g}", f"top_k {self.top_k}"]
        if self.repetition_penalty != 1.0:
            parts.append(f"repetition_penalty {self.repetition_penalty:g}")
        if self.min_p is not None:
            parts.append(f"min_p {self.min_p:g}")
        parts.append(f"seed {self.seed}" if self.seed is not None else "seed random")
        return "sampling: " + ", ".join(parts)


@dataclass(frozen=True)
class SamplingRequest:
    """Sampling settings as a user gave them (None: not given). Sampling is asked for by a
    temperature above 0, or by top-p, top-k or a repetition penalty without a temperature."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _check(self.temperature, self.top_k, self.top_p, self.repetition_penalty, self.seed)

    @property
    def wants_sampling(self) -> bool:
        return wants_sampling(self.temperature, self.top_p, self.top_k, self.repetition_penalty)

    @property
    def filters_given(self) -> list[str]:
        """The settings given besides temperature and seed (each of them asks for sampling)."""
        return [name for name in ("top_p", "top_k", "repetition_penalty") if getattr(self, name) is not None]

    def resolve(self, generation_config: object | None) -> SamplingConfig:
        """What the decoder decodes with: greedy unless sampling was asked for, else these
        settings merged with the model's generation config as `generate` merges them."""
        if not self.wants_sampling:
            return SamplingConfig.greedy()
        return SamplingConfig.resolve(
            generation_config,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
        )


def _check(temperature, top_k, top_p, repetition_penalty, seed) -> None:
    """Raise SettingError for the first value out of range (None: not given, fine)."""
    # float() reads "nan" and "inf": name that, not the range a NaN fails or an infinity passes
    for name, value in (("temperature", temperature), ("top_p", top_p), ("repetition_penalty", repetition_penalty)):
        if value is not None and not math.isfinite(value):
            raise SettingError(name, value, "not a finite number")
    if temperature is not None and temperature < 0.0:
        raise SettingError("temperature", temperature, "must be 0 (greedy) or more")
    if top_k is not None and top_k < 0:
        raise SettingError("top_k", top_k, "must be 0 (off) or more")
    if top_p is not None and not 0.0 <= top_p <= 1.0:
        raise SettingError("top_p", top_p, "must be between 0 and 1")
    if repetition_penalty is not None and repetition_penalty <= 0.0:
        raise SettingError("repetition_penalty", repetition_penalty, "must be more than 0")
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise SettingError("seed", seed, f"must be between 0 and {SEED_LIMIT - 1}")


def wants_sampling(
    temperature: float | None,
    top_p: float | None = None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
) -> bool:
    """tr decodes greedily unless asked to sample: a temperature above 0, or no temperature but a
    top-p, top-k or repetition penalty (then at the model's temperature). Temperature 0 is greedy."""
    if temperature is not None:
        return temperature > 0
    return any(v is not None for v in (top_p, top_k, repetition_penalty))


def ignored_generation_settings(generation_config: object | None) -> list[str]:
    """Sampling warpers the model's generation config turns on that tr does not apply ("typical_p=0.9")."""
    if generation_config is None:
        return []
    out = []
    for name, active in _UNSUPPORTED.items():
        value = getattr(generation_config, name, None)
        if active(value):
            out.append(f"{name}={value}")
    return out
