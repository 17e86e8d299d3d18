"""Sampling (tr_cli/core/sampling.py): the processed distribution equals transformers' warpers and
`generate`'s own processed scores; settings merge like `generate`; the acceptance walk on
hand-made trees and distributions (all children rejected, duplicate siblings, zero-probability
children, two levels) emits exactly the target distribution; seeded decoding is reproducible and
does not depend on the drafts."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from statistics import NormalDist

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tr_cli.core import PRESETS, StopCondition, TokenRecyclingDecoder, TreeBuffers, TreeSpec
from tr_cli.core.errors import SettingError
from tr_cli.core.sampling import Sampler, draw, positional_uniform, process_logits, sample_accept
from tr_cli.core.sampling_config import HF_DEFAULTS, SamplingConfig, SamplingRequest, ignored_generation_settings

from tiny_models import tiny_model


def hf_probabilities(logits: torch.Tensor, config: SamplingConfig, context: list[int]) -> torch.Tensor:
    """transformers' public processors in `generate`'s order, for one row."""
    scores = logits.to(torch.float32)[None].clone()
    ids = torch.tensor([context])
    if config.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(config.repetition_penalty)(ids, scores)
    if config.temperature != 1.0:
        scores = TemperatureLogitsWarper(config.temperature)(ids, scores)
    if config.top_k != 0:
        scores = TopKLogitsWarper(config.top_k)(ids, scores)
    if config.top_p < 1.0:
        scores = TopPLogitsWarper(config.top_p)(ids, scores)
    if config.min_p is not None:
        scores = MinPLogitsWarper(config.min_p)(ids, scores)
    return scores.softmax(dim=-1)[0]


CONFIGS = [
    SamplingConfig(temperature=1.0, top_k=0, top_p=1.0),
    SamplingConfig(temperature=0.7, top_k=0, top_p=0.9),
    SamplingConfig(temperature=1.3, top_k=20, top_p=1.0),
    SamplingConfig(temperature=0.6, top_k=50, top_p=0.8),
    SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.3),
    SamplingConfig(temperature=1.0, top_k=0, top_p=0.5, repetition_penalty=0.7),
    SamplingConfig(temperature=0.9, top_k=0, top_p=1.0, min_p=0.1),
    SamplingConfig(temperature=1.0, top_k=1, top_p=1.0),
    SamplingConfig(temperature=1.0, top_k=0, top_p=0.0),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_processing_equals_hf_warpers(config, ties):
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        logits = torch.randn(500, generator=g) * 3
        if ties:  # coarse values: many exact ties, also at the top-k and top-p thresholds
            logits = (logits * 2).round() / 2
        context = torch.randint(0, 500, (30,), generator=g).tolist()
        ours = process_logits(logits, config, context)
        assert torch.equal(ours, hf_probabilities(logits, config, context))
        assert ours.dtype == torch.float32 and torch.isclose(ours.sum(), torch.tensor(1.0))


def test_processing_of_rows_and_bfloat16_logits():
    """(rows, V) logits are processed row by row; bf16 logits are processed as float32 copies."""
    config = SamplingConfig(temperature=0.7, top_k=10, top_p=0.9)
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    rows = process_logits(logits, config)
    for i in range(3):
        assert torch.equal(rows[i], hf_probabilities(logits[i], config, [0]))


def test_resolve_merges_like_generate():
    empty = GenerationConfig()
    assert SamplingConfig.resolve(empty) == SamplingConfig(temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0)
    assert HF_DEFAULTS == {
        k: v for k, v in GenerationConfig._get_default_generation_params().items() if k in HF_DEFAULTS
    }
    model = GenerationConfig(temperature=0.6, top_k=20, top_p=0.95, repetition_penalty=1.05, min_p=0.05)
    resolved = SamplingConfig.resolve(model, seed=4)
    assert resolved == SamplingConfig(
        temperature=0.6, top_k=20, top_p=0.95, repetition_penalty=1.05, seed=4, min_p=0.05
    )
    overridden = SamplingConfig.resolve(model, temperature=0.9, top_k=0, top_p=1.0, repetition_penalty=1.0)
    assert (overridden.temperature, overridden.top_k, overridden.top_p, overridden.repetition_penalty) == (
        0.9,
        0,
        1.0,
        1.0,
    )
    assert SamplingConfig.resolve(None, temperature=0.0).is_greedy
    assert SamplingConfig.greedy().generate_kwargs() == {"do_sample": False}
    assert resolved.generate_kwargs() == {
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "repetition_penalty": 1.05,
        "min_p": 0.05,
    }
    assert ignored_generation_settings(GenerationConfig(typical_p=0.9, eta_cutoff=0.0)) == ["typical_p=0.9"]
    assert ignored_generation_settings(empty) == []


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"temperature": -1.0}, "temperature must be 0 (greedy) or more"),
        ({"temperature": float("nan")}, "temperature not a finite number"),
        ({"temperature": float("inf")}, "temperature not a finite number"),
        ({"top_p": float("inf")}, "top_p not a finite number"),
        ({"top_p": float("nan")}, "top_p not a finite number"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty not a finite number"),
        ({"repetition_penalty": float("-inf")}, "repetition_penalty not a finite number"),
        ({"top_p": 2.0}, "top_p must be between 0 and 1"),
        ({"top_k": -3}, "top_k must be 0 (off) or more"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be more than 0"),
        ({"seed": -1}, "seed must be between 0 and"),
    ],
)
def test_bad_settings(kwargs, words):
    setting, reason = words.split(" ", 1)
    for make in (SamplingConfig, SamplingRequest):  # as resolved, and as a user gave them
        with pytest.raises(SettingError) as caught:
            make(**kwargs)
        assert caught.value.setting == setting and caught.value.reason.startswith(reason)


def test_processing_matches_generate_processed_scores():
    """`generate(do_sample=True, output_scores=True)` returns the processed scores it samples from:
    ours are the same, from the same merged settings (top_k=50 comes from transformers' defaults
    here: V=320, so it cuts)."""
    model = tiny_model("llama")
    prompt = [5, 17, 42, 9]
    for overrides, model_defaults in [
        ({"temperature": 0.8}, {}),
        ({}, {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.3}),
        ({"top_k": 7}, {"top_p": 0.95, "min_p": 0.02}),
    ]:
        for name, value in model_defaults.items():
            setattr(model.generation_config, name, value)
        config = SamplingConfig.resolve(model.generation_config, **overrides)
        torch.manual_seed(0)
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=4,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
                **overrides,
            )
            sequence = out.sequences[0].tolist()
            logits = model(out.sequences).logits[0]
        for name in model_defaults:
            setattr(model.generation_config, name, None)
        for i, scores in enumerate(out.scores):
            position = len(prompt) + i
            ours = process_logits(logits[position - 1], config, sequence[:position])
            theirs = scores[0].softmax(-1)
            assert torch.equal(ours > 0, theirs > 0)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
        if not model_defaults and "top_k" not in overrides:
            assert int((out.scores[0][0] > float("-inf")).sum()) == 50


# --- the acceptance walk on hand-made distributions ----------------------------------------------

V = 8
# Node order: 1=[0] 2=[1] 3=[2] 4=[0,0] 5=[0,1] 6=[1,0] 7=[0,0,0]; parents 1,2,3->0; 4,5->1; 6->2; 7->4
SMALL = TreeSpec.from_paths("small", [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
BUFFERS = TreeBuffers.build(SMALL)
FREE = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)


def test_small_tree_layout():
    assert SMALL.parents == (-1, 0, 0, 0, 1, 1, 2, 4)
    assert SMALL.children == ((1, 2, 3), (4, 5), (6,), (), (7,), (), (), ())


def rows(*probabilities: list[float]) -> torch.Tensor:
    """Logits whose softmax is the given distribution per node (zeros become -inf)."""
    p = torch.tensor(probabilities, dtype=torch.float64)
    return torch.where(p > 0, p.log(), torch.tensor(float("-inf"), dtype=torch.float64)).float()


def exact_outcomes(
    tokens: list[int], logits: torch.Tensor, config: SamplingConfig, context: list[int]
) -> dict[tuple[int, ...], float]:
    """P(emitted tokens) of sampling token by token: the next token after a node is drawn from that
    node's processed distribution; the sequence goes on while some child (of any node carrying the
    same path) has that token."""
    children = SMALL.children
    out: dict[tuple[int, ...], float] = {}

    def visit(nodes: list[int], emitted: tuple[int, ...], prob: float) -> None:
        p = process_logits(logits[nodes[0]], config, context + list(emitted)).double()
        for y in range(V):
            if p[y] == 0:
                continue
            matched = [c for n in nodes for c in children[n] if tokens[c] == y]
            if matched:
                visit(matched, emitted + (y,), prob * float(p[y]))
            else:
                out[emitted + (y,)] = out.get(emitted + (y,), 0.0) + prob * float(p[y])

    visit([0], (), 1.0)
    return out


def chi_square(counts: Counter, expected: dict, n: int) -> tuple[float, float]:
    """Pearson's statistic over cells with expected count >= 5 (the rest pooled) and the 1e-4
    critical value of its chi-square distribution (Wilson-Hilferty). Outcomes outside `expected`
    make the statistic infinite."""
    if any(key not in expected for key in counts):
        return math.inf, 0.0
    big = [k for k, p in expected.items() if p * n >= 5]
    cells = [(counts[k], expected[k] * n) for k in big]
    rest = n - sum(e for _, e in cells)
    if rest >= 1e-9:
        cells.append((n - sum(counts[k] for k in big), rest))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = max(len(cells) - 1, 1)
    z = NormalDist().inv_cdf(1 - 1e-4)
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


def generator_uniform(generator: torch.Generator):
    """Uniforms taken one after the other from a torch.Generator (the position is ignored), so
    repeated walks over the same context draw afresh."""
    return lambda position: float(torch.rand((), generator=generator, dtype=torch.float64))


def run_walk(
    tokens: list[int],
    logits: torch.Tensor,
    config: SamplingConfig,
    n: int,
    seed: int = 0,
    context: list[int] = (),
    accept=sample_accept,
) -> Counter:
    uniform = generator_uniform(torch.Generator().manual_seed(seed))
    tree_tokens = torch.tensor(tokens)
    counts: Counter = Counter()
    for _ in range(n):
        acc = accept(tree_tokens, logits, BUFFERS, config, list(context), uniform)
        # The accepted nodes are a chain from the root carrying the accepted tokens.
        parent = 0
        for node, token in zip(acc.nodes, acc.tokens, strict=True):
            assert SMALL.parents[node] == parent and tokens[node] == token
            parent = node
        if accept is sample_accept:
            # correct: the root and every node carrying the token drawn after its (correct) parent.
            correct = acc.correct.tolist()
            assert correct[0] and all(correct[i] for i in acc.nodes)
            for i in range(1, len(tokens)):
                depth = SMALL.depths[i]
                emitted = [*acc.tokens, acc.bonus]
                drawn = emitted[depth - 1] if depth <= len(emitted) else None
                assert correct[i] == (correct[SMALL.parents[i]] and tokens[i] == drawn)
        counts[(*acc.tokens, acc.bonus)] += 1
    return counts


# Per node (root, 1..7): distributions over V=8 tokens.
P_ROOT = [0.30, 0.25, 0.15, 0.10, 0.08, 0.06, 0.04, 0.02]
P_MID = [0.05, 0.40, 0.20, 0.05, 0.05, 0.05, 0.10, 0.10]
P_DEEP = [0.10, 0.10, 0.10, 0.30, 0.20, 0.05, 0.05, 0.10]
LOGITS = rows(P_ROOT, P_MID, P_DEEP, P_MID, P_DEEP, P_ROOT, P_DEEP, P_MID)


@pytest.mark.parametrize(
    "case, tokens, config",
    [
        # Children 0, 1, 2 of the root are the likeliest tokens: drafts are often right.
        ("likely drafts", [7, 0, 1, 2, 1, 2, 3, 4], FREE),
        # All three root children have p = 0 after top-k 3: always rejected, bonus from p.
        ("all rejected", [7, 5, 6, 7, 1, 2, 3, 4], SamplingConfig(temperature=1.0, top_k=3, top_p=1.0)),
        # Duplicate siblings: nodes 1 and 2 both carry token 0; no second chance, their children merge.
        ("duplicates", [7, 0, 0, 1, 1, 2, 3, 4], FREE),
        # A zero-probability child (token 7 under top-p 0.9) among likely ones.
        ("zero child", [7, 7, 0, 1, 1, 7, 3, 4], SamplingConfig(temperature=1.0, top_k=0, top_p=0.9)),
        # Temperature, top-p and repetition penalty: every node sees the context plus its own path.
        (
            "penalty",
            [7, 0, 1, 2, 1, 0, 3, 4],
            SamplingConfig(temperature=0.8, top_k=0, top_p=0.95, repetition_penalty=2.0),
        ),
    ],
)
@pytest.mark.slow  # statistical
def test_walk_emits_the_target_distribution(case, tokens, config):
    n = 6000
    context = [3, 1]
    expected = exact_outcomes(tokens, LOGITS, config, context)
    assert math.isclose(sum(expected.values()), 1.0, rel_tol=1e-6)
    counts = run_walk(tokens, LOGITS, config, n, seed=11, context=context)
    stat, critical = chi_square(counts, expected, n)
    assert stat < critical, (case, stat, critical)
    depth = Counter(len(k) - 1 for k in counts.elements())
    if case == "all rejected":
        assert depth == Counter({0: n})
    else:
        assert depth[0] > 0 and depth[1] > 0 and depth[2] > 0
    if case == "duplicates":
        # Token 0 comes first with p_root(0) = 0.30, not 0.30 + 0.70 * 0.30 (a second chance).
        assert abs(sum(c for k, c in counts.items() if k[0] == 0) / n - 0.30) < 0.02
        # After 0 the children of both duplicates are tried: token 3 only exists under node 2.
        assert counts[(0, 3, 2)] + counts[(0, 3, 3)] > 0
    if case == "zero child":
        assert all(k[0] != 7 for k in counts)


def literal_walk(renormalize: bool):
    """The walk as the issue states it (one uniform per child tried), or without renormalizing."""

    def accept(tree_tokens, logits, buffers, config, context, uniform):
        tokens = tree_tokens.tolist()
        children = buffers.spec.children
        node, nodes, accepted = 0, [], []
        while True:
            p = process_logits(logits[node], config, context + accepted).double()
            residual = p.clone()
            chosen = None
            for child in children[node]:
                x = tokens[child]
                mass = residual.sum() if renormalize else 1.0
                if residual[x] > 0 and uniform(0) < residual[x] / mass:
                    chosen = child
                    break
                residual[x] = 0.0
            if chosen is None:
                bonus = draw(residual / residual.sum(), uniform(0))
                from tr_cli.core.verify import Acceptance

                return Acceptance(nodes, accepted, bonus)
            nodes.append(chosen)
            accepted.append(tokens[chosen])
            node = chosen

    return accept


@pytest.mark.slow  # statistical
def test_literal_walk_agrees_and_the_statistic_catches_a_wrong_one():
    """The issue's sequential walk matches the same exact distribution; dropping the
    renormalization (accept x_i with p(x_i) instead of p(x_i) / (1 - rejected mass)) does not,
    and the same chi-square test says so."""
    tokens = [7, 0, 1, 2, 1, 2, 3, 4]
    n = 4000
    expected = exact_outcomes(tokens, LOGITS, FREE, [])
    right, critical = chi_square(run_walk(tokens, LOGITS, FREE, n, seed=5, accept=literal_walk(True)), expected, n)
    wrong, _ = chi_square(run_walk(tokens, LOGITS, FREE, n, seed=5, accept=literal_walk(False)), expected, n)
    assert right < critical < wrong, (right, critical, wrong)


def test_draw_never_returns_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    uniform = positional_uniform(1)
    drawn = Counter(draw(probs, uniform(i)) for i in range(2000))
    assert set(drawn) == {1, 3} and abs(drawn[1] - 1000) < 150
    # The ends of [0, 1): the lowest uniform takes the first token with mass, the highest the last.
    assert draw(probs, 0.0) == 1 and draw(probs, 1 - 2**-53) == 3
    assert draw(torch.tensor([0.0, 0.0, 1.0]), 1 - 2**-53) == 2 and draw(torch.tensor([0.0, 0.0, 1.0]), 0.0) == 2


# --- the decoder --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def generate(model, config: SamplingConfig | None, prompt: list[int], n: int, matrix=None, tree=None) -> list[int]:
    decoder = TokenRecyclingDecoder(model, matrix=matrix, tree=tree, sampling=config)
    return decoder.generate(prompt, StopCondition.build(n, [])).tokens


def plain_sampling(model, config: SamplingConfig, prompt: list[int], n: int) -> list[int]:
    """Token-by-token sampling with the same uniforms: full forward, process, draw the token at
    each position with the Sampler's uniform for it."""
    ids = list(prompt)
    uniform = Sampler(config).uniforms(ids)  # one conversation: the list grows in place
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(draw(process_logits(logits, config, ids), uniform(len(ids))))
    return ids[len(prompt) :]


def test_greedy_config_takes_the_greedy_path(llama):
    prompt = [5, 6, 7, 8]
    greedy = generate(llama, None, prompt, 20)
    assert generate(llama, SamplingConfig.greedy(), prompt, 20) == greedy
    assert TokenRecyclingDecoder(llama, sampling=SamplingConfig(temperature=0.0, seed=3)).sampler is None


def test_seeded_sampling_is_reproducible_and_independent_of_the_drafts(llama):
    """Same seed -> same tokens, with a cold or a warm matrix, with another tree, and the same as
    plain token-by-token sampling with that seed (float32: the tree's logits are the model's)."""
    config = SamplingConfig(temperature=0.8, top_k=0, top_p=0.95, repetition_penalty=1.1, seed=7)
    prompt = [11, 12, 13, 14, 15]
    decoder = TokenRecyclingDecoder(llama, sampling=config)
    result = decoder.generate(prompt, StopCondition.build(40, []), keep_events=True)
    cold = result.tokens
    assert sum(len(e.accepted_tokens) for e in result.events) > 0  # drafts were accepted along the way
    warm = generate(llama, config, prompt, 40, matrix=decoder.matrix.clone())
    small_tree = generate(llama, config, prompt, 40, tree=TreeSpec.from_paths("t", [[0], [1], [0, 0]]))
    assert cold == warm == small_tree == plain_sampling(llama, config, prompt, 40)
    other_seed = generate(llama, replace(config, seed=8), prompt, 40)
    assert other_seed != cold


def test_seeded_conversation_does_not_depend_on_the_drafts_turn_after_turn(llama):
    """A stop condition cuts drafted tokens off a step, more or fewer depending on the drafts: the
    next turns still get the same tokens, since a token's uniform depends on its position only."""
    config = SamplingConfig(temperature=0.3, top_k=0, top_p=1.0, seed=11)  # peaked: long accepted drafts
    turns = ([31, 32, 33], [34, 35], [36], [37, 38])

    def conversation(matrix=None, tree=None) -> tuple[list[list[int]], int]:
        decoder = TokenRecyclingDecoder(llama, matrix=matrix, tree=tree, sampling=config)
        replies, cuts = [], 0
        for ids in turns:
            result = decoder.generate(ids, StopCondition.build(4, []), keep_events=True)
            replies.append(result.tokens)
            last = result.events[-1]
            cuts += last.step > 0 and last.bonus is None  # the step's bonus (at least) was cut off
        return replies, cuts

    cold, _ = conversation()
    warm_matrix = TokenRecyclingDecoder(llama, sampling=config)
    for ids in turns * 3:  # warm a matrix on this very conversation: drafts reach far
        warm_matrix.generate(ids, StopCondition.build(4, []))
    warm, cuts = conversation(matrix=warm_matrix.matrix.clone())
    assert cuts > 0
    assert cold == warm == conversation(tree=TreeSpec.from_paths("t", [[0], [0, 0]]))[0]


def test_set_sampling_restarts_the_stream_and_switches_modes(llama):
    prompt = [21, 22, 23]
    config = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, seed=1)
    decoder = TokenRecyclingDecoder(llama)
    decoder.set_sampling(config)
    first = decoder.generate(prompt, StopCondition.build(12, [])).tokens
    decoder.reset()
    second = decoder.generate(prompt, StopCondition.build(12, [])).tokens
    assert first != second  # the stream went on
    decoder.reset()
    decoder.set_sampling(config)
    assert decoder.generate(prompt, StopCondition.build(12, [])).tokens == first
    decoder.reset()
    decoder.set_sampling(None)
    assert decoder.generate(prompt, StopCondition.build(12, [])).tokens == generate(llama, None, prompt, 12)


def test_sampler_rejects_a_greedy_config():
    with pytest.raises(ValueError):
        Sampler(SamplingConfig.greedy())


def test_paper_tree_children_index():
    children = PRESETS["paper"].children
    assert len(children[0]) == 8 and sum(len(c) for c in children) == PRESETS["paper"].size
