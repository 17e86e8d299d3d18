"""Lossless sampling: the distribution `model.generate(do_sample=True)` samples from, and tree
verification that emits tokens from exactly that distribution.

Processing follows transformers 5.24 (`GenerationMixin._get_logits_processor`, `_sample`): float32
logits -> repetition penalty -> temperature -> top-k -> top-p -> min-p -> softmax, with the same
tensor operations as its RepetitionPenaltyLogitsProcessor / TemperatureLogitsWarper /
TopKLogitsWarper / TopPLogitsWarper / MinPLogitsWarper (min_tokens_to_keep=1), so ties and
thresholds fall the same way. The settings themselves are merged in sampling_config.py.

Verification of a draft tree whose children are single tokens (the draft "distribution" q of a child
is a point mass) walks from the root. At a node with processed distribution p it tries the children
x_1, x_2, ... in order, accepting x_i with probability p(x_i) / (1 - sum_{j<i} p(x_j)) (p
renormalized over what was not rejected yet); a rejected token gets p(x) = 0 (so a duplicate
sibling of a rejected child is rejected surely); if every child is rejected the bonus token is drawn
from the remaining p, renormalized. Exactness, in a few lines: with distinct x_j and Z_i =
1 - sum_{j<i} p(x_j), the chance of accepting x_i is prod_{j<i}(1 - p(x_j)/Z_j) * p(x_i)/Z_i =
prod_{j<i}(Z_{j+1}/Z_j) * p(x_i)/Z_i = p(x_i) (telescoping, Z_1 = 1); a token y that is no child
comes out as the bonus with chance Z_{m+1} * p(y)/Z_{m+1} = p(y). So the token after every node is
distributed exactly as p, and an accepted child's own logits are the model's distribution given
that token (its context is the conversation plus its ancestor path), so by induction over
positions the emitted sequence is distributed as sampling the model token by token.

Implementation of that walk: one uniform u per emitted token draws y ~ p by inverse CDF, and child
x_i is accepted iff y == x_i for the first such i. Given that x_1..x_{i-1} were rejected (y is none
of them), P(y == x_i) = p(x_i) / (1 - sum_{j<i} p(x_j)), which is exactly the acceptance above, and
when all are rejected y is distributed as the remaining p renormalized: the same walk, with its
randomness coupled so that each emitted token takes one uniform. Siblings with the same token have
the same context, hence the same distribution after them: the walk follows all of them at once (a
later duplicate is never a second chance for a rejected token), which changes how deep the drafts
reach, never which token comes out.

The uniform of a token is a function of its position in the conversation and a key drawn per
conversation from a torch.Generator seeded with the seed (Sampler). So a seeded run's tokens depend
neither on the drafts (matrix state, tree) nor on how many drafted tokens a stop condition cut off:
the same seed gives the same tokens with a cold or a hot matrix, turn after turn, as long as the
logits are the same. A cut token's uniform may serve the next turn's token at that position; that
is still exact, as a token that never entered the conversation influences nothing after it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch

from .constraint import TokenConstraint
from .sampling_config import SamplingConfig
from .tree_buffers import TreeBuffers
from .verify import Acceptance, walk_accept


def _seen_mask(context_ids: Sequence[int] | torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    seen = torch.zeros(vocab, dtype=torch.bool, device=device)
    ids = torch.as_tensor(context_ids, dtype=torch.long).to(device)
    if ids.numel():
        # Ids past the output vocabulary (embedding larger than the head) cannot be penalized: HF drops them.
        ids = ids[(ids >= 0) & (ids < vocab)]
        seen[ids] = True
    return seen


def _probabilities(
    row: torch.Tensor, config: SamplingConfig, seen: torch.Tensor | None, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """The processed distribution of one logits row; `seen` marks the context's tokens, `allowed`
    the tokens a grammar allows (a caller's logits processor: after the penalty, before the warpers)."""
    scores = row.to(torch.float32)  # generate processes float32 copies of the logits
    if seen is not None and config.repetition_penalty != 1.0:
        penalized = torch.where(scores < 0, scores * config.repetition_penalty, scores / config.repetition_penalty)
        scores = torch.where(seen, penalized, scores)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if config.temperature != 1.0:
        scores = scores / config.temperature
    if config.top_k != 0:
        k = min(config.top_k, scores.shape[-1])
        # Everything below the k-th value goes; ties with it stay (more than k tokens may survive).
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], float("-inf"))
    if config.top_p < 1.0:
        # Ascending sort of the whole row as HF does, so tied values are ordered the same way.
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - config.top_p)
        drop_sorted[..., -1:] = False  # min_tokens_to_keep = 1: the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    if config.min_p is not None:
        probs = torch.softmax(scores, dim=-1)
        drop = probs < config.min_p * probs.amax(dim=-1, keepdim=True)
        drop.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)


def process_logits(
    logits_row: torch.Tensor,
    config: SamplingConfig,
    context_ids: Sequence[int] | torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Probabilities (float32, on the row's device) that `generate(do_sample=True)` samples the next
    token from, given the logits after `context_ids` (the whole sequence so far: only the repetition
    penalty reads it) and the tokens a grammar `allowed` there. Works on (V,) or (rows, V) logits
    with one shared context."""
    seen = None
    if config.repetition_penalty != 1.0 and context_ids is not None:
        seen = _seen_mask(context_ids, logits_row.shape[-1], logits_row.device)
    return _probabilities(logits_row, config, seen, allowed)


# The uniform in [0, 1) for the token at a position of the conversation.
Uniform = Callable[[int], float]


def positional_uniform(key: int) -> Uniform:
    """u(position): 53 bits of a BLAKE2b hash of (key, position), so any position can be drawn in
    any order and drawing it again gives the same number."""

    def uniform(position: int) -> float:
        digest = hashlib.blake2b(key.to_bytes(8, "little") + position.to_bytes(8, "little"), digest_size=8).digest()
        return (int.from_bytes(digest, "little") >> 11) * 2.0**-53

    return uniform


def draw(probs: torch.Tensor, u: float) -> int:
    """The token of `probs` (V,) at uniform u in [0, 1), by inverse CDF.

    A zero-probability token is never returned: its CDF entry equals its predecessor's exactly.
    """
    acc = torch.float32 if probs.device.type == "mps" else torch.float64  # MPS has no float64
    cdf = probs.to(acc).cumsum(0)
    total = cdf[-1]
    # u < 1, but u * total may round up to total: keep the target strictly below it.
    target = torch.minimum(total * u, torch.nextafter(total, total.new_zeros(())))
    return int(torch.searchsorted(cdf, target.view(1), right=True))


def sample_accept(
    tree_tokens: torch.Tensor,
    logits: torch.Tensor,
    buffers: TreeBuffers,
    config: SamplingConfig,
    context_ids: Sequence[int],
    uniform: Uniform,
    constraint: TokenConstraint | None = None,
) -> Acceptance:
    """The exact acceptance walk (module docstring) over one verified tree.

    tree_tokens: (n+1,) with the root (the last emitted token) first; logits: (n+1, V), row i the
    model's logits after node i; context_ids: the conversation up to and including the root;
    uniform(position) gives the uniform of the token drawn at that conversation position. Only
    the rows the walk visits are processed (accepted nodes + 1). Under a `constraint` each draw
    is from the grammar-masked distribution (core/constraint.py), which advances by every token.
    """
    vocab = logits.shape[-1]
    # The repetition penalty of a node sees the conversation plus the node's ancestor path, exactly
    # what `generate` would have as input_ids there.
    seen = _seen_mask(context_ids, vocab, logits.device) if config.repetition_penalty != 1.0 else None
    start = len(context_ids)

    def choose(node: int, emitted: int) -> int:
        allowed = constraint.allowed().to(logits.device) if constraint is not None else None
        y = draw(_probabilities(logits[node], config, seen, allowed), uniform(start + emitted))
        if seen is not None:
            seen[y] = True
        if constraint is not None:
            constraint.advance(y)
        return y

    return walk_accept(tree_tokens.tolist(), buffers, logits.device, choose)


class Sampler:
    """A SamplingConfig with its randomness: a CPU torch.Generator seeded with the seed (the same
    numbers on every device) draws one key per conversation; a token's uniform is
    positional_uniform(key)(its position in the conversation).

    A conversation is one `context_ids` list object, grown in place (the decoder's token list; a
    reset makes a new one). A new conversation gets the next key, so /retry or the next bench
    prompt samples afresh, while a seeded run replays exactly."""

    def __init__(self, config: SamplingConfig) -> None:
        if config.is_greedy:
            raise ValueError("a greedy config has nothing to sample")
        self.config = config
        self.generator = torch.Generator()
        if config.seed is None:
            self.generator.seed()  # a fresh nondeterministic seed
        else:
            self.generator.manual_seed(config.seed)
        self._conversation: Sequence[int] | None = None
        self._uniform: Uniform | None = None

    def uniforms(self, context_ids: Sequence[int]) -> Uniform:
        """The uniforms of the conversation `context_ids` belongs to."""
        if context_ids is not self._conversation or self._uniform is None:
            key = int(torch.randint(0, 2**63 - 1, (), generator=self.generator))
            self._conversation, self._uniform = context_ids, positional_uniform(key)
        return self._uniform

    def first_token(
        self, logits_row: torch.Tensor, context_ids: Sequence[int], allowed: torch.Tensor | None = None
    ) -> int:
        """The token after a prefill, sampled from the processed distribution (over the tokens a
        grammar `allowed`, when one constrains the reply)."""
        probs = process_logits(logits_row, self.config, context_ids, allowed)
        return draw(probs, self.uniforms(context_ids)(len(context_ids)))

    def accept(
        self,
        tree_tokens: torch.Tensor,
        logits: torch.Tensor,
        buffers: TreeBuffers,
        context_ids: Sequence[int],
        constraint: TokenConstraint | None = None,
    ) -> Acceptance:
        uniform = self.uniforms(context_ids)
        return sample_accept(tree_tokens, logits, buffers, self.config, context_ids, uniform, constraint)
