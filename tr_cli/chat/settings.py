"""The settings of a chat (`/set KEY VALUE`) and the sampling they ask for."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..core.errors import SettingError
from ..core.sampling_config import SamplingConfig, SamplingRequest
from ..engine.options import DEFAULT_MAX_NEW_TOKENS
from .errors import CommandError

LIVE_MODES = ("path", "tree", "off")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
SETTING_KEYS = ("max_new_tokens", *SAMPLING_KEYS, "live", "verbose")

_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"off", "false", "no", "0"}


@dataclass
class Settings:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    live: str = "path"
    verbose: bool = False
    # Sampling as the user asked for it (a field None: not given; the model's generation config,
    # else transformers' default, applies). Greedy unless it asks for sampling.
    sampling: SamplingRequest = field(default_factory=SamplingRequest)

    def sampling_config(self, generation_config: object | None) -> SamplingConfig:
        """What the decoder samples with (greedy when no sampling was asked for)."""
        return self.sampling.resolve(generation_config)

    def _set_sampling(self, key: str, value: str) -> str:
        lowered = value.lower()
        if not value:
            raise CommandError(
                f"usage: /set {key} VALUE ({'a number or random' if key == 'seed' else 'a number or default'})"
            )
        if (key == "seed" and lowered in ("random", "none")) or (key != "seed" and lowered in ("default", "none")):
            self.sampling = replace(self.sampling, **{key: None})
            return f"{key} = {'random' if key == 'seed' else 'default'}"
        whole = key in ("top_k", "seed")
        try:
            number = int(value) if whole else float(value)
        except ValueError:
            raise CommandError(f"{key} takes {'a whole number' if whole else 'a number'}, got {value!r}") from None
        try:
            self.sampling = replace(self.sampling, **{key: number})
        except SettingError as exc:
            raise CommandError(f"{key} {exc.reason}, got {number}") from None
        return f"{key} = {number:g}" if not whole else f"{key} = {number}"

    def set(self, key: str, value: str) -> str:
        """Apply `/set KEY VALUE`; returns what to tell the user."""
        key = key.strip().lower().replace("-", "_")
        value = value.strip()
        if key in SAMPLING_KEYS:
            return self._set_sampling(key, value)
        if key == "max_new_tokens":
            try:
                number = int(value)
            except ValueError:
                raise CommandError(f"max_new_tokens takes a whole number, got {value!r}") from None
            if number < 1:
                raise CommandError(f"max_new_tokens must be at least 1, got {number}")
            self.max_new_tokens = number
            return f"max_new_tokens = {number}"
        if key == "live":
            if value not in LIVE_MODES:
                raise CommandError(f"live takes one of {', '.join(LIVE_MODES)}, got {value!r}")
            self.live = value
            return f"live = {value}"
        if key == "verbose":
            lowered = value.lower()
            if lowered in _TRUE or not lowered:
                self.verbose = True
            elif lowered in _FALSE:
                self.verbose = False
            else:
                raise CommandError(f"verbose takes on or off, got {value!r}")
            return f"verbose = {'on' if self.verbose else 'off'}"
        if not key:
            raise CommandError(f"usage: /set KEY VALUE ({', '.join(SETTING_KEYS)})")
        raise CommandError(f"no setting {key!r}; settings: {', '.join(SETTING_KEYS)}")

    def describe(self, sampling: SamplingConfig | None = None) -> list[tuple[str, str]]:
        """(name, value) rows; `sampling` is what the decoder uses (these settings merged with the
        model's generation config)."""
        return [
            ("max_new_tokens", str(self.max_new_tokens)),
            ("live", self.live),
            ("verbose", "on" if self.verbose else "off"),
            ("decoding", (sampling or self.sampling_config(None)).describe()),
        ]
