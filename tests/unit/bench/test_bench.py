"""Bench arithmetic: metrics, the JSON schema, the identical check (greedy) and the distribution
check (sampling), method names, and turns that follow each method's own answer."""

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from tr_cli.bench.distribution import DistributionCheck, check_tokens
from tr_cli.bench.metrics import summarize
from tr_cli.bench.report import check_report, render, rows, sources_line
from tr_cli.bench.run import Run
from tr_cli.bench.runner import run_bench
from tr_cli.core import StepTimings
from tr_cli.errors import SettingError
from tr_cli.text.prompts import PromptRecord

runner = CliRunner()


# --- arithmetic on hand-made runs ------------------------------------------------------------


def fake_runner(outputs: dict[int, list[int]], seconds: float, steps_per_token: float, first: float | None = None):
    """Answers by prompt length; a fixed time, step count and time to the first token per run."""

    def run(ids, max_new_tokens, grammar):
        tokens = outputs[len(ids)][:max_new_tokens]
        return Run(tokens, seconds, round((len(tokens) - 1) * steps_per_token), first_token_seconds=first)

    return run


def test_metrics_identical_check_and_schema():
    prompts = [PromptRecord("a", "qa", ("xx",)), PromptRecord("b", "rag", ("yyy",))]
    outputs = {2: [1, 2, 3, 4, 5], 3: [6, 7, 8]}
    different = {2: [1, 2, 3, 4, 5], 3: [6, 7, 9]}  # differs on prompt b only
    runners = {
        "baseline": fake_runner(outputs, 2.0, 1.0, first=1.0),
        "tr": fake_runner(different, 1.0, 0.5, first=0.75),
    }
    results = run_bench(
        runners, prompts, encode=lambda history, text: [0] * len(text), decode=str, max_new_tokens=10, warmup=0
    )
    report = summarize(results, {"model": "fake"})
    assert set(report) == {"environment", "methods", "categories", "prompts"}
    keys = {
        "tokens_per_second",
        "speedup",
        "decode_tokens_per_second",
        "decode_speedup",
        "mean_accepted_tokens",
        "new_tokens",
        "wall_seconds",
        "identical_to_baseline",
        "prompts",
        "distribution_check",
        "speedup_vs_ar",
        "step_split",
        "tokens_per_step",
        "drafted_tokens",
        "verified_nodes",
    }
    assert set(report["methods"]["baseline"]) == keys == set(report["methods"]["tr"])
    base, tr = report["methods"]["baseline"], report["methods"]["tr"]
    assert base["new_tokens"] == 8 and base["wall_seconds"] == 4.0 and base["tokens_per_second"] == 2.0
    assert base["speedup"] == 1.0 and base["mean_accepted_tokens"] == 1.0
    assert tr["tokens_per_second"] == 4.0 and tr["speedup"] == 2.0
    # After the first token: 6 step tokens in 2 x 1.0 s (baseline), in 2 x 0.25 s (tr).
    assert base["decode_tokens_per_second"] == 3.0 and tr["decode_tokens_per_second"] == 12.0
    assert tr["decode_speedup"] == 4.0
    assert tr["mean_accepted_tokens"] == pytest.approx((4 + 2) / (2 + 1))  # step tokens / steps
    assert base["identical_to_baseline"] == 2 and tr["identical_to_baseline"] == 1 and tr["prompts"] == 2
    assert tr["distribution_check"] is None  # greedy
    assert report["categories"]["qa"]["tr"]["speedup"] == 2.0
    assert set(report["categories"]["rag"]["tr"]) == {
        "speedup",
        "mean_accepted_tokens",
        "tokens_per_second",
        "speedup_vs_ar",
    }
    assert tr["speedup_vs_ar"] is None and tr["step_split"] is None  # no ar method, no phase timings
    by_id = {p["id"]: p for p in report["prompts"]}
    assert by_id["a"]["tr"]["identical_to_baseline"] is True and by_id["b"]["tr"]["identical_to_baseline"] is False
    assert set(by_id["a"]["tr"]) == {"new_tokens", "wall_seconds", "mean_accepted_tokens", "identical_to_baseline"}
    json.loads(render(report, "json"))
    md = render(report, "md")
    assert "| tr | 2.00× | 2.00× |" in md and "| 2.00× | 4.00× |" in md  # speedup, then decode
    assert "tr,all,4.0000,2.0000" in render(report, "csv")


def test_each_sources_acceptance_is_reported():
    """Accepted of verified draft nodes per source, summed over prompts, in the report and its text."""
    prompts = [PromptRecord("a", "qa", ("xx",)), PromptRecord("b", "qa", ("yyy",))]
    outputs = {2: [1, 2, 3, 4, 5], 3: [6, 7, 8]}

    def drafting(ids, n, grammar):
        return Run(
            outputs[len(ids)][:n], 1.0, 2, drafted=Counter(matrix=1, lookup=2), verified=Counter(matrix=4, lookup=2)
        )

    runners = {"baseline": fake_runner(outputs, 2.0, 1.0), "tr": drafting}
    report = summarize(
        run_bench(runners, prompts, encode=lambda h, t: [0] * len(t), decode=str, max_new_tokens=10, warmup=0),
        {"model": "fake"},
    )
    tr = report["methods"]["tr"]
    assert tr["drafted_tokens"] == {"lookup": 4, "matrix": 2} and tr["verified_nodes"] == {"lookup": 4, "matrix": 8}
    assert report["methods"]["baseline"]["verified_nodes"] is None  # it does not draft
    line = "draft nodes accepted/verified by source · tr: lookup 4/4 100%, matrix 2/8 25%"
    assert sources_line(report) == line and line in render(report, "md")
    check_report(json.loads(render(report, "json")))


def test_ar_ratio_and_step_split():
    """With `ar` in the run every method also gets its speedup over ar; our decoders report how
    their step time splits and the share outside the forward."""
    prompts = [PromptRecord("a", "qa", ("xx",))]
    outputs = {2: [1, 2, 3, 4, 5]}

    def timed(seconds: float, steps: int, phases: dict[str, float]):
        return lambda ids, n, grammar: Run(outputs[len(ids)][:n], seconds, steps, StepTimings(**phases))

    runners = {
        "baseline": fake_runner(outputs, 4.0, 1.0),
        "ar": timed(2.0, 4, {"draft": 0.0, "forward": 1.8, "verify": 0.1, "update": 0.1}),
        "tr": timed(1.0, 2, {"draft": 0.01, "forward": 0.9, "verify": 0.05, "update": 0.04}),
    }
    report = summarize(
        run_bench(runners, prompts, encode=lambda h, t: [0] * len(t), decode=str, max_new_tokens=10, warmup=0),
        {"model": "fake"},
    )
    tr, ar = report["methods"]["tr"], report["methods"]["ar"]
    assert tr["speedup"] == 4.0 and tr["speedup_vs_ar"] == 2.0 and ar["speedup_vs_ar"] == 1.0
    assert report["methods"]["baseline"]["step_split"] is None
    assert tr["step_split"]["step_ms"] == pytest.approx(
        {"draft": 5.0, "forward": 450.0, "verify": 25.0, "update": 20.0}
    )
    assert tr["step_split"]["outside_forward"] == pytest.approx(0.1)
    assert report["categories"]["qa"]["tr"]["speedup_vs_ar"] == 2.0
    header, body = rows(report)
    assert header[-3:] == ["vs ar", "outside fwd", "identical"]
    assert body[2][-3:] == ["2.00×", "10.0%", "1/1"]


def test_method_names_and_their_drafts():
    from tr_cli.bench.methods import ONE_TOKEN, parse_methods
    from tr_cli.core.drafters import DraftPlan

    plan = DraftPlan.parse("auto+lookup4")
    methods = parse_methods(["baseline", "pld", "ar", "tr", "tr:paper", "tr:auto+lookup0"], plan, 8)
    assert [m.name for m in methods] == ["baseline", "pld", "ar", "tr", "tr:paper", "tr:auto+lookup0"]
    assert [m.plan for m in methods[:4]] == [None, None, ONE_TOKEN, plan]  # tr drafts as the command says
    assert methods[1].prompt_lookup and not methods[0].prompt_lookup
    assert methods[3].on_engine_decoder and not methods[4].on_engine_decoder
    assert methods[4].plan == DraftPlan.parse("paper") and methods[5].plan == DraftPlan.parse("auto+lookup0")
    assert ONE_TOKEN.name == "none"  # ar: one token per step, no sources
    for bad, words in (
        (["bogus"], "unknown method"),
        (["tr:"], "unknown method"),
        (["tr", "tr"], "listed twice"),
        ([], "no method given"),
        (["tr:paper+lookupX"], "unknown tree"),
        (["tr:paper"], "candidate slot"),  # the paper's tree needs k >= 8
    ):
        with pytest.raises(SettingError, match=words) as caught:
            parse_methods(bad, plan, 4 if bad == ["tr:paper"] else 8)
        assert caught.value.setting == "methods"


def test_weight_variants_compare_with_generate_on_the_same_weights():
    """METHOD@int8 is checked against baseline@int8 and measured against ar@int8, while its
    speedup stays over the dense baseline (what the quantization gains)."""
    from tr_cli.bench.methods import counterpart, parse_methods, split_weights
    from tr_cli.core.drafters import DraftPlan
    from tr_cli.models import WeightsMode

    names = ["baseline", "ar", "baseline@int8", "ar@int8", "tr@int8", "tr:paper@int4", "tr@int4+bf16"]
    methods = parse_methods(names, DraftPlan.of(), 8)
    assert [m.name for m in methods] == names
    modes = [WeightsMode.parse(w) for w in ("int8", "int8", "int8", "int4", "int4+bf16")]
    assert [m.weights for m in methods] == [None, None, *modes]
    assert split_weights("tr:paper@int4") == ("tr:paper", "int4") and split_weights("tr") == ("tr", None)
    assert split_weights("tr:auto+lookup0@int4+bf16") == ("tr:auto+lookup0", "int4+bf16")
    assert counterpart("tr@int8", "baseline") == "baseline@int8" and counterpart("tr", "ar") == "ar"
    for bad, message in (
        (["tr@int3"], "weights int3: unknown"),
        (["tr@dense"], "quantized"),
        (["bogus@int8"], "unknown method"),
    ):
        with pytest.raises(SettingError, match=message):
            parse_methods(bad, DraftPlan.of(), 8)

    prompts = [PromptRecord("a", "qa", ("xx",))]
    dense, quantized = {2: [1, 2, 3, 4, 5]}, {2: [1, 2, 9, 9, 9]}
    runners = {
        "baseline": fake_runner(dense, 4.0, 1.0),
        "baseline@int8": fake_runner(quantized, 2.0, 1.0),
        "ar@int8": fake_runner(quantized, 2.0, 1.0),
        "tr@int8": fake_runner(quantized, 1.0, 0.5),
        "tr@int4": fake_runner(dense, 1.0, 0.5),
    }
    report = summarize(
        run_bench(runners, prompts, encode=lambda h, t: [0] * len(t), decode=str, max_new_tokens=10, warmup=0),
        {"model": "fake"},
    )
    methods = report["methods"]
    assert methods["tr@int8"]["identical_to_baseline"] == 1  # equal to baseline@int8, not to baseline
    assert methods["tr@int4"]["identical_to_baseline"] is None  # no baseline@int4 ran
    assert methods["tr@int8"]["speedup"] == 4.0 and methods["tr@int8"]["speedup_vs_ar"] == 2.0
    assert methods["baseline"]["speedup_vs_ar"] is None and methods["tr@int4"]["speedup_vs_ar"] is None
    header, body = rows(report)
    assert "vs ar" in header
    assert [row[-1] for row in body] == ["1/1", "1/1", "1/1", "1/1", "–"]


def test_sampled_report_checks_distributions_instead_of_tokens():
    """Sampling: no token-by-token comparison; each method's distribution check (sums over every
    counted run) is reported, and the table's last column is its z."""
    prompts = [PromptRecord("a", "qa", ("xx",)), PromptRecord("b", "rag", ("yyy",))]
    outputs = {2: [1, 2, 3, 4, 5], 3: [6, 7, 8]}
    runners = {"baseline": fake_runner(outputs, 2.0, 1.0), "tr": fake_runner(outputs, 1.0, 0.5)}
    seen = []

    def check(name, ids, tokens):
        seen.append((len(ids), tokens))
        surprisal = 1.5 if len(ids) == 2 else 0.5
        return DistributionCheck(
            tokens=len(tokens), surprisal=surprisal * len(tokens), entropy=len(tokens), variance=0.25 * len(tokens)
        )

    results = run_bench(
        runners,
        prompts,
        encode=lambda history, text: [0] * len(text),
        decode=str,
        max_new_tokens=10,
        warmup=1,
        check=check,
    )
    assert seen == [(2, [1, 2, 3, 4, 5]), (2, [1, 2, 3, 4, 5]), (3, [6, 7, 8]), (3, [6, 7, 8])]  # warmup unchecked
    report = summarize(results, {"model": "fake", "decoding": "sampling: temperature 0.7"}, sampled=True)
    tr = report["methods"]["tr"]
    assert tr["identical_to_baseline"] is None and tr["speedup"] == 2.0
    # (5 * 1.5 + 3 * 0.5 - 8) / sqrt(8 * 0.25) = 1 / sqrt(2)
    assert tr["distribution_check"] == {
        "tokens": 8,
        "mean_surprisal": 9 / 8,
        "mean_entropy": 1.0,
        "z": pytest.approx(2**-0.5),
        "outside_support": 0,
    }
    assert all(p["tr"]["identical_to_baseline"] is None for p in report["prompts"])
    md = render(report, "md")
    assert (
        "| dist. z |" in md
        and "| tr | 2.00× | 2.00× | 2.00 | 4.0 | 2.00× | – | +0.71 |" in md
        and "identical" not in md
    )
    assert "tr,all,4.0000,2.0000,2.0000,,2,0.7071" in render(report, "csv")


@pytest.mark.slow  # statistical
def test_distribution_check_tells_sampling_from_greedy():
    """Tokens sampled from the model's distribution score a z near 0 (about standard normal: this
    seed gives +0.58, the 40 seeds 0..39 average +0.07 with deviation 1.2); greedy tokens under the
    same distribution score far below (they are always the likeliest)."""
    from tr_cli.core import StopCondition, TokenRecyclingDecoder
    from tr_cli.core.sampling_config import SamplingConfig

    from tiny_models import tiny_model

    model = tiny_model("llama")
    config = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2, seed=2)
    prompt = [5, 6, 7, 8]
    sampled = TokenRecyclingDecoder(model, sampling=config).generate(prompt, StopCondition.build(150, [])).tokens
    greedy = TokenRecyclingDecoder(model).generate(prompt, StopCondition.build(150, [])).tokens
    good, bad = check_tokens(model, config, prompt, sampled), check_tokens(model, config, prompt, greedy)
    assert good.tokens == 150 and good.outside_support == 0 and abs(good.z) < 4, good
    assert bad.z < -10, bad


def test_next_turn_follows_the_methods_own_answer():
    seen = []

    def encode(history, text):
        seen.append(list(history))
        return [0] * (len(text) + 2 * len(history))

    outputs = {3: [1, 2], 6: [3]}
    prompts = [PromptRecord("a", "writing", ("one", "t"))]
    run_bench(
        {"tr": fake_runner(outputs, 1.0, 1.0)},
        prompts,
        encode,
        decode=lambda ids: f"reply{ids}",
        max_new_tokens=5,
        warmup=0,
    )
    assert seen == [[], [("one", "reply[1, 2]")]]
