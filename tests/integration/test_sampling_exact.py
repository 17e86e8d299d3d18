"""Statistical exactness end to end: the first three tokens sampled through TokenRecyclingDecoder
(warm matrix, the paper's tree, drafts often right and often wrong) follow exactly the joint
distribution of sampling the model token by token, computed exactly here by enumerating every
prefix. So do transformers' `generate(do_sample=True)` samples. A walk that forgets to renormalize
fails the same test, so the test can fail. Fixed seeds: the statistics are deterministic."""

from __future__ import annotations

import math
from collections import Counter
from statistics import NormalDist

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tr_cli.core.sampling as sampling
from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.core.sampling import process_logits
from tr_cli.core.sampling_config import SamplingConfig
from tr_cli.core.verify import Acceptance

pytestmark = pytest.mark.slow  # statistical: thousands of sampled generations

VOCAB = 20
PROMPT = [1, 2, 3]
LENGTH = 3  # joint distribution of the first three generated tokens: 20**3 outcomes
ALPHA = 1e-4  # critical level of the chi-square tests (deterministic: fixed seeds)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A 1-layer model over a 20-token vocabulary: one thread is faster than two here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config)
    # Larger weights than the default init: peaked distributions (top token ~0.4), so the warm
    # matrix's drafts are often right and often wrong.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.5 if "embed" in name else 0.3)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def exact_joint(model, config: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(x1, x2, x3) of token-by-token sampling: one batched forward over every prompt + x1 + x2."""
    pairs = [(a, b) for a in range(VOCAB) for b in range(VOCAB)]
    ids = torch.tensor([PROMPT + [a, b] for a, b in pairs])
    with torch.inference_mode():
        logits = model(ids).logits
    n = len(PROMPT)
    p1 = process_logits(logits[0, n - 1], config, PROMPT).double()
    p2 = {a: process_logits(logits[a * VOCAB, n], config, PROMPT + [a]).double() for a in range(VOCAB)}
    joint = {}
    for row, (a, b) in enumerate(pairs):
        if p1[a] == 0 or p2[a][b] == 0:
            continue
        p3 = process_logits(logits[row, n + 1], config, PROMPT + [a, b]).double()
        for c in torch.nonzero(p3).flatten().tolist():
            joint[(a, b, c)] = float(p1[a] * p2[a][b] * p3[c])
    return joint


def chi_square(counts: Counter, expected: dict, n: int) -> tuple[float, float, float]:
    """(Pearson's statistic over cells expecting >= 5 samples, the rest pooled; its 1 - ALPHA
    critical value by Wilson-Hilferty; total variation distance). Infinite if a sample has
    probability 0."""
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - expected.get(k, 0.0)) for k in set(counts) | set(expected))
    if any(k not in expected for k in counts):
        return math.inf, 0.0, tv
    big = [k for k, p in expected.items() if p * n >= 5]
    cells = [(counts[k], expected[k] * n) for k in big]
    cells.append((n - sum(counts[k] for k in big), n - sum(e for _, e in cells)))
    stat = sum((o - e) ** 2 / e for o, e in cells if e > 1e-9)
    df = len(cells) - 1
    z = NormalDist().inv_cdf(1 - ALPHA)
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3, tv


def marginal(distribution: dict[tuple[int, ...], float], position: int) -> dict[tuple[int], float]:
    out: dict[tuple[int], float] = {}
    for key, value in distribution.items():
        out[(key[position],)] = out.get((key[position],), 0.0) + value
    return out


def statistics(counts: Counter, expected: dict, n: int) -> dict[str, tuple[float, float, float]]:
    """The chi-square test of the joint distribution, and of the second and third tokens alone
    (the ones the walk draws: fewer cells, more power against a bias there)."""
    out = {"joint": chi_square(counts, expected, n)}
    for position in (1, 2):
        observed = Counter()
        for key, count in counts.items():
            observed[(key[position],)] += count
        out[f"x{position + 1}"] = chi_square(observed, marginal(expected, position), n)
    return out


def report(name: str, n: int, stats: dict) -> str:
    return f"{name}: n={n} " + " ".join(f"{k}: chi2={s:.1f}/{c:.1f} TV={tv:.3f}" for k, (s, c, tv) in stats.items())


def sample_tr(model, config: SamplingConfig, n: int) -> tuple[Counter, int, int]:
    """n samples of the first LENGTH tokens through the decoder, one conversation each, one matrix
    (warmed by the first samples, updated by all); and how many tokens came from an accepted draft
    and how many from a bonus drawn after every child of a node was rejected."""
    decoder = TokenRecyclingDecoder(model, sampling=config)
    counts: Counter = Counter()
    accepted = rejected = 0
    for _ in range(n):
        decoder.reset()
        result = decoder.generate(PROMPT, StopCondition.build(LENGTH, []), keep_events=True)
        counts[tuple(result.tokens)] += 1
        for event in result.events[1:]:
            accepted += len(event.accepted_tokens)
            rejected += event.bonus is not None
    return counts, accepted, rejected


SETTINGS = [
    ("T=1", SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, seed=101), 3000),
    ("T=0.7 top_p=0.9", SamplingConfig(temperature=0.7, top_k=0, top_p=0.9, seed=202), 2500),
    (
        "top_k=5 penalty=1.3",
        SamplingConfig(temperature=1.0, top_k=5, top_p=1.0, repetition_penalty=1.3, seed=303),
        2500,
    ),
]


@pytest.mark.parametrize("name, config, n", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_token_recycling_samples_the_exact_joint_distribution(model, name, config, n):
    expected = exact_joint(model, config)
    assert math.isclose(sum(expected.values()), 1.0, rel_tol=1e-6)
    counts, accepted, rejected = sample_tr(model, config, n)
    # Drafts were often right and often wrong: both branches of the walk carry weight.
    drawn = accepted + rejected
    assert accepted > 0.15 * drawn and rejected > 0.15 * drawn, (accepted, rejected)
    stats = statistics(counts, expected, n)
    print(report(name, n, stats), f"draft tokens={accepted} bonus tokens={rejected}")
    assert all(stat < critical for stat, critical, _ in stats.values()), stats


WRONG_WALK_RANDOM = torch.Generator().manual_seed(7)


def unnormalized_walk(tree_tokens, logits, buffers, config, context_ids, uniform, constraint=None) -> Acceptance:
    """A wrong walk: accepts child x with p(x) rather than p(x) renormalized over what is left
    (one uniform per child tried, from its own generator)."""
    generator = WRONG_WALK_RANDOM
    tokens = tree_tokens.tolist()
    children = buffers.spec.children
    node, nodes, accepted = 0, [], []
    while True:
        p = process_logits(logits[node], config, list(context_ids) + accepted).double()
        residual = p.clone()
        chosen = None
        for child in children[node]:
            x = tokens[child]
            if residual[x] > 0 and torch.rand((), generator=generator, dtype=torch.float64) < p[x]:
                chosen = child
                break
            residual[x] = 0.0
        if chosen is None:
            bonus = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            correct = torch.zeros(len(tokens), dtype=torch.bool)
            correct[[0] + nodes] = True
            return Acceptance(nodes, accepted, bonus, correct)
        nodes.append(chosen)
        accepted.append(tokens[chosen])
        node = chosen


def test_the_statistic_detects_a_wrong_walk(model, monkeypatch):
    """Negative control: the decoder with the unnormalized walk fails the same test by far."""
    name, config, _ = SETTINGS[0]
    n = 1500
    monkeypatch.setattr(sampling, "sample_accept", unnormalized_walk)  # our module, looked up per step
    counts, _, _ = sample_tr(model, config, n)
    stats = statistics(counts, exact_joint(model, config), n)
    print(report(f"wrong walk ({name})", n, stats))
    assert all(stat > critical for stat, critical, _ in stats.values()), stats
    assert max(stat / critical for stat, critical, _ in stats.values()) > 3, stats


def test_transformers_generate_samples_the_same_distribution(model):
    """`generate(do_sample=True)` with settings from the model's generation config (none passed)
    samples the distribution SamplingConfig.resolve computes."""
    n = 4000
    model.generation_config.temperature = 0.7
    model.generation_config.top_p = 0.9
    try:
        config = SamplingConfig.resolve(model.generation_config)
        torch.manual_seed(404)
        ids = torch.tensor([PROMPT] * n)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=LENGTH)
    finally:
        model.generation_config.temperature = None
        model.generation_config.top_p = None
    counts = Counter(tuple(row) for row in out[:, len(PROMPT) :].tolist())
    stats = statistics(counts, exact_joint(model, config), n)
    print(report("transformers generate", n, stats))
    assert all(stat < critical for stat, critical, _ in stats.values()), stats
