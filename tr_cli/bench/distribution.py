"""The distribution check of a sampled bench: do a method's tokens come from the model's
distribution?

Outputs of two samplers never match token for token, so instead each method's tokens are scored
under the processed distribution p_t the model gives at their position (one teacher-forced forward
after the timed run): surprisal s_t = -log p_t(x_t), entropy H_t = E_p[s], variance V_t = Var_p[s].
For an exact sampler E[s_t - H_t | the past] = 0 at every position, so
z = sum(s_t - H_t) / sqrt(sum V_t) is about standard normal; a sampler that over-picks likely tokens
(greedy-ish) drives z well below 0, one that picks unlikely tokens drives it above. |z| > 3 is a
red flag. Tokens the check's own forward gives probability 0 (a bf16 near-tie at a top-k/top-p cut)
are counted apart.

The logits are computed as the decoders computed them: the prompt as a prompt, then every token's
row as a decoding step's (models/weights.py's `+bf16` modes run the two on different weights).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..core.sampling import process_logits
from ..core.sampling_config import SamplingConfig
from ..core.step_scope import decoding_step

ROWS_PER_CHUNK = 64  # processed distributions held at once (rows x vocabulary floats)


@dataclass
class DistributionCheck:
    tokens: int = 0
    surprisal: float = 0.0  # sums over tokens
    entropy: float = 0.0
    variance: float = 0.0
    outside_support: int = 0

    def add(self, other: DistributionCheck) -> None:
        self.tokens += other.tokens
        self.surprisal += other.surprisal
        self.entropy += other.entropy
        self.variance += other.variance
        self.outside_support += other.outside_support

    @property
    def z(self) -> float | None:
        return (self.surprisal - self.entropy) / math.sqrt(self.variance) if self.variance > 0 else None

    def to_json(self) -> dict:
        return {
            "tokens": self.tokens,
            "mean_surprisal": self.surprisal / self.tokens if self.tokens else None,
            "mean_entropy": self.entropy / self.tokens if self.tokens else None,
            "z": self.z,
            "outside_support": self.outside_support,
        }


def _score(probs: torch.Tensor, chosen: torch.Tensor) -> DistributionCheck:
    """Sums over rows of probs (rows, V) with the chosen token of each row."""
    p = probs.to(torch.float64)
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    entropy = -(p * logp).sum(dim=-1)
    second = (p * logp * logp).sum(dim=-1)
    picked = p.gather(1, chosen[:, None])[:, 0]
    inside = picked > 0
    surprisal = -picked[inside].log()
    variance = (second - entropy * entropy).clamp(min=0)
    return DistributionCheck(
        tokens=int(inside.sum()),
        surprisal=float(surprisal.sum()),
        entropy=float(entropy[inside].sum()),
        variance=float(variance[inside].sum()),
        outside_support=int((~inside).sum()),
    )


def _accepts(model: torch.nn.Module, keyword: str) -> bool:
    return keyword in inspect.signature(model.forward).parameters


@torch.inference_mode()
def position_logits(model: torch.nn.Module, ids: list[int], tokens: list[int]) -> torch.Tensor:
    """The logits (len(tokens), V) each of `tokens`, generated after prompt `ids`, was drawn from.

    Computed as `generate` and tr's decoder compute them: the prompt in one forward, whose last
    row gives the first token, then tokens[:-1] over the prompt's cache inside `decoding_step()`,
    each row on the weights a one-token forward takes (SDPA may still round several query rows a
    bf16 ulp otherwise than one, as in tr's own steps). One forward over prompt and tokens would
    run the tokens' rows as a prompt's: on a `+bf16` model, on the bf16 weights instead of the
    quantized ones that produced them. On a dense model both agree but for float rounding."""
    device = model.get_input_embeddings().weight.device
    # transformers 5 renamed `past_key_values` to `cache`; pass whichever the model takes.
    keyword = "cache" if _accepts(model, "cache") else "past_key_values"
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    last_only = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}  # as generate's prefill
    prompt = model(torch.tensor([ids], device=device), use_cache=True, **{keyword: cache}, **last_only)
    first = prompt.logits[0, -1:]
    if len(tokens) == 1:
        return first
    with decoding_step():
        rest = model(torch.tensor([tokens[:-1]], device=device), use_cache=True, **{keyword: cache}).logits[0]
    return torch.cat([first, rest.to(first.device)])


@torch.inference_mode()
def check_tokens(
    model: torch.nn.Module, config: SamplingConfig, ids: list[int], tokens: list[int]
) -> DistributionCheck:
    """Score `tokens`, generated after prompt `ids`, under the processed distribution at each position."""
    if not tokens:
        return DistributionCheck()
    logits = position_logits(model, ids, tokens)
    chosen = torch.tensor(tokens, device=logits.device)
    total = DistributionCheck()
    for start in range(0, len(tokens), ROWS_PER_CHUNK):
        rows = logits[start : start + ROWS_PER_CHUNK]
        if config.repetition_penalty != 1.0:  # each position sees its own context
            probs = torch.stack([process_logits(row, config, ids + tokens[: start + i]) for i, row in enumerate(rows)])
        else:
            probs = process_logits(rows, config)
        total.add(_score(probs, chosen[start : start + ROWS_PER_CHUNK]))
    return total
