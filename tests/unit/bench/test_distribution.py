"""The distribution check (tr_cli/bench/distribution.py): it scores each token under the logits the
model produced it from (on a `+bf16` model: the prompt on bf16, every token after on the quantized
weights), processed as `generate` processes them, and sums surprisal, entropy and variance right.
That z tells sampling from greedy is tests/unit/bench/test_bench.py's statistical test.

Most models here run eager attention: its matmuls compute each query row alone, as the quantized
layers do, so the check's one step over many rows gives `generate`'s one-row forwards bit for bit.
SDPA (the default) rounds several query rows otherwise than one, by a bf16 ulp or two."""

import math

import pytest
import torch

from tr_cli.bench.distribution import DistributionCheck, _score, check_tokens, position_logits
from tr_cli.core.sampling_config import SamplingConfig
from tr_cli.models.weights import quantize
from tr_cli.models.weights_mode import WeightsMode

from tiny_models import random_prompt, tiny_model

UNFILTERED = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)  # softmax of the raw logits


def _model(arch: str, mode: str, dtype: torch.dtype = torch.bfloat16, attention: str = "eager") -> torch.nn.Module:
    model = tiny_model(arch, dtype=dtype)
    model.set_attn_implementation(attention)
    quantize(model, WeightsMode.parse(mode))
    model.generation_config.eos_token_id = None  # run to the budget: every position gets scored
    return model


def _generate(
    model: torch.nn.Module, ids: list[int], n: int, **sampling
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """`generate`'s tokens, the raw logits it computed each from (n, V) and the processed scores
    it sampled or picked them from (n, V)."""
    prompt = torch.tensor([ids])
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=n,
        pad_token_id=0,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
        **sampling,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    assert len(tokens) == n
    return tokens, torch.cat(out.logits), torch.cat(out.scores)


def _expected(scores: torch.Tensor, tokens: list[int]) -> DistributionCheck:
    """The check's sums written out from softmax(scores), independently of the module."""
    p = torch.softmax(scores.float(), dim=-1).double()
    logp = torch.where(p > 0, p.log(), 0.0)
    entropy = -(p * logp).sum(-1)
    variance = (p * logp * logp).sum(-1) - entropy**2
    picked = p[torch.arange(len(tokens)), tokens]
    assert bool((picked > 0).all())
    return DistributionCheck(
        tokens=len(tokens),
        surprisal=float(-picked.log().sum()),
        entropy=float(entropy.sum()),
        variance=float(variance.sum()),
    )


def _assert_same_sums(check: DistributionCheck, expected: DistributionCheck) -> None:
    assert (check.tokens, check.outside_support) == (expected.tokens, 0)
    # Same float32 probabilities on both sides, summed in float64: only summation order differs
    # (~1e-15). Logits computed on other weights (int4 against bf16: percents) miss by far more.
    for field in ("surprisal", "entropy", "variance"):
        assert getattr(check, field) == pytest.approx(getattr(expected, field), rel=1e-9), field


@pytest.mark.parametrize("mode", ["int8+bf16", "int4+bf16"])
def test_check_scores_a_bf16_mode_models_tokens_under_the_logits_generate_sampled_them_from(mode):
    """A `+bf16` model computes a prompt on bf16 and every generated token's row on the quantized
    weights; the check must score each token under those logits, not a prompt-style forward's."""
    model = _model("llama", mode)
    ids = random_prompt(20, 1)
    torch.manual_seed(0)
    tokens, logits, _ = _generate(model, ids, 16, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    _assert_same_sums(check_tokens(model, UNFILTERED, ids, tokens), _expected(logits, tokens))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2"])
@pytest.mark.parametrize("mode", ["int8+bf16", "int4+bf16"])
def test_position_logits_are_the_logits_generate_drew_each_token_from(arch, mode):
    """Bit for bit: the prompt's last row and each token's own row on the quantized weights, as
    `generate` computed them one per forward (the kernels compute each row alone, so several rows
    in one decoding step give the same numbers). A prompt past mistral's 12-token window and 40
    tokens after it exercise the cache and its masks."""
    model = _model(arch, mode)
    for seed, (length, n) in enumerate([(1, 3), (20, 16), (30, 40)]):
        ids = random_prompt(length, seed)
        tokens, logits, _ = _generate(model, ids, n, do_sample=False)
        got = position_logits(model, ids, tokens)
        assert got.shape == logits.shape
        off = (got.float() - logits).abs().max().item()
        assert torch.equal(got.float(), logits), f"prompt of {length}: off by up to {off:.3g}"


def test_with_sdpa_position_logits_are_generates_up_to_attention_rounding():
    """SDPA computes several query rows otherwise than one (tr's decoding steps meet the same): a
    bf16 ulp or two of the logits (an ulp is 1/64 for |logit| in [2, 4), the largest here; up to
    2/64 measured), so three ulps bound it. Scoring the tokens on the bf16 weights instead of the
    int4 ones missed by 0.4-1.0."""
    model = _model("llama", "int4+bf16", attention="sdpa")
    ids = random_prompt(30, 2)
    tokens, logits, _ = _generate(model, ids, 40, do_sample=False)
    got = position_logits(model, ids, tokens).float()
    assert torch.equal(got[0], logits[0])  # the prompt's last row: one forward on both sides
    assert logits.abs().max() < 4 and (got - logits).abs().max() <= 3 / 64


def test_position_logits_of_one_token_are_the_prompts_last_row():
    model = _model("llama", "int4+bf16")
    ids = random_prompt(10, 0)
    tokens, logits, _ = _generate(model, ids, 1, do_sample=False)
    assert torch.equal(position_logits(model, ids, tokens).float(), logits)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_position_logits_of_a_dense_model_are_generates_up_to_float_rounding(arch):
    """A dense model computes the same numbers as a prompt or as steps, but for rounding: in
    float32 that is ~1e-6 on logits of size ~1; a wrong position or cache misses by far more."""
    model = _model(arch, "dense", dtype=torch.float32)
    ids = random_prompt(20, 4)
    tokens, logits, _ = _generate(model, ids, 24, do_sample=False)
    torch.testing.assert_close(position_logits(model, ids, tokens), logits, rtol=1e-5, atol=1e-5)


def test_check_scores_under_the_distribution_generate_sampled_from():
    """With repetition penalty, temperature and top-k, each token is scored under `generate`'s own
    processed scores at its position (`output_scores`: what it sampled from)."""
    model = _model("llama", "int4+bf16")
    config = SamplingConfig(temperature=0.7, top_k=40, top_p=1.0, repetition_penalty=1.3)
    ids = random_prompt(20, 2)
    torch.manual_seed(1)
    sampling = dict(do_sample=True, temperature=0.7, top_k=40, top_p=1.0, repetition_penalty=1.3)
    tokens, _, scores = _generate(model, ids, 30, **sampling)
    _assert_same_sums(check_tokens(model, config, ids, tokens), _expected(scores, tokens))


def test_score_sums_surprisal_entropy_and_variance_and_counts_impossible_tokens_apart():
    """p = (1/2, 1/4, 1/4, 0): entropy 1.5 ln 2, E[s²] = (1/2 + 1/4 * 4 * 2) ln²2 = 2.5 ln²2, so
    the variance is (2.5 - 2.25) ln²2. Token 0 has surprisal ln 2, token 1 2 ln 2; token 3 is
    outside the support and adds nothing but its count."""
    ln2 = math.log(2)
    probs = torch.tensor([[0.5, 0.25, 0.25, 0.0]] * 3)
    check = _score(probs, torch.tensor([0, 1, 3]))
    assert (check.tokens, check.outside_support) == (2, 1)
    assert check.surprisal == pytest.approx(3 * ln2)
    assert check.entropy == pytest.approx(2 * 1.5 * ln2)
    assert check.variance == pytest.approx(2 * 0.25 * ln2**2)
    # z = (3 - 3) ln 2 / ...: these two tokens are exactly as surprising as expected
    assert check.z == pytest.approx(0.0)


def test_z_is_negative_for_likely_tokens_positive_for_unlikely_ones_and_absent_without_spread():
    probs = torch.tensor([[0.5, 0.25, 0.25]] * 4)
    likely, unlikely = _score(probs, torch.zeros(4, dtype=torch.long)), _score(probs, torch.ones(4, dtype=torch.long))
    # (4 ln 2 - 6 ln 2) / sqrt(4 * 0.25 ln²2) = -2; (8 - 6) / 1 = +2
    assert likely.z == pytest.approx(-2.0) and unlikely.z == pytest.approx(2.0)
    certain = _score(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    assert (certain.surprisal, certain.entropy, certain.variance, certain.z) == (0.0, 0.0, 0.0, None)
    summed = DistributionCheck()
    summed.add(likely)
    summed.add(unlikely)
    assert summed.tokens == 8 and summed.z == pytest.approx(0.0)
    assert summed.to_json()["mean_entropy"] == pytest.approx(1.5 * math.log(2))
