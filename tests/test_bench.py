"""`tr bench`: prompt files, metric arithmetic, the JSON schema, the identical check (greedy) and
the distribution check (sampling), and real end-to-end runs on a tiny random model and on SmolLM2."""

import json

import pytest
from typer.testing import CliRunner

from tr_cli.bench.distribution import DistributionCheck, check_tokens
from tr_cli.bench.methods import Run
from tr_cli.bench.metrics import summarize
from tr_cli.bench.report import rows, render
from tr_cli.bench.runner import run_bench
from tr_cli.cli import app
from tr_cli.errors import UserError
from tr_cli.prompts import PromptRecord, load_prompts, read_prompt_file, select_prompts

runner = CliRunner()


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


# --- prompt files -----------------------------------------------------------------------------

def test_three_prompt_formats(tmp_path):
    spec = tmp_path / "spec.jsonl"
    spec.write_text('{"question_id": 7, "category": "qa", "turns": ["A?", "B?"]}\n\n{"question_id": 8, "category": "rag", "turns": ["C"]}\n')
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"prompt": "Hello"}\n{"prompt": "World", "category": "x", "id": "w"}\n')
    text = tmp_path / "prompts.txt"
    text.write_text("First prompt\nstill first.\n\n\nSecond prompt.\n")
    assert read_prompt_file(spec) == [PromptRecord("7", "qa", ("A?", "B?")), PromptRecord("8", "rag", ("C",))]
    assert read_prompt_file(plain) == [PromptRecord("1", "default", ("Hello",)), PromptRecord("w", "x", ("World",))]
    assert [r.turns for r in read_prompt_file(text)] == [("First prompt\nstill first.",), ("Second prompt.",)]
    bundled = load_prompts(None)
    assert len(bundled) >= 10 and len({r.category for r in bundled}) >= 6


@pytest.mark.parametrize("content, line, words", [
    ('{"turns": ["ok"]}\n{"turns": ["ok"]\n', 2, "not valid JSON"),
    ('{"turns": ["ok"]}\n\n{"turns": []}\n', 3, "non-empty list"),
    ('{"question": "x"}\n', 1, 'expected a "turns" list'),
    ('[1, 2]\n', 1, "expected a JSON object"),
])
def test_bad_prompt_files_name_the_line(tmp_path, content, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UserError) as info:
        read_prompt_file(path)
    assert f"{path}:{line}:" in str(info.value) and words in str(info.value)


def test_select_prompts_filters_in_order():
    records = [PromptRecord(str(i), cat, ("x",)) for i, cat in enumerate("aabbbca")]
    assert [r.id for r in select_prompts(records, [], 1, None, "f")] == ["0", "2", "5"]
    assert [r.id for r in select_prompts(records, ["a", "c"], None, None, "f")] == ["0", "1", "5", "6"]
    assert [r.id for r in select_prompts(records, ["b"], 2, 1, "f")] == ["2"]
    with pytest.raises(UserError, match="z not in f"):
        select_prompts(records, ["z"], None, None, "f")


# --- arithmetic on hand-made runs ------------------------------------------------------------

def fake_runner(outputs: dict[int, list[int]], seconds: float, steps_per_token: float):
    """Answers by prompt length; a fixed time and step count per run."""
    def run(ids, max_new_tokens):
        tokens = outputs[len(ids)][:max_new_tokens]
        return Run(tokens, seconds, round((len(tokens) - 1) * steps_per_token))
    return run


def test_metrics_identical_check_and_schema():
    prompts = [PromptRecord("a", "qa", ("xx",)), PromptRecord("b", "rag", ("yyy",))]
    outputs = {2: [1, 2, 3, 4, 5], 3: [6, 7, 8]}
    different = {2: [1, 2, 3, 4, 5], 3: [6, 7, 9]}  # differs on prompt b only
    runners = {
        "baseline": fake_runner(outputs, 2.0, 1.0),
        "tr": fake_runner(different, 1.0, 0.5),
    }
    results = run_bench(runners, prompts, encode=lambda history, text: [0] * len(text), decode=str,
                        max_new_tokens=10, warmup=0)
    report = summarize(results, {"model": "fake"})
    assert set(report) == {"environment", "methods", "categories", "prompts"}
    keys = {"tokens_per_second", "speedup", "mean_accepted_tokens", "new_tokens", "wall_seconds", "identical_to_baseline", "prompts",
            "distribution_check", "speedup_vs_ar", "step_split"}
    assert set(report["methods"]["baseline"]) == keys == set(report["methods"]["tr"])
    base, tr = report["methods"]["baseline"], report["methods"]["tr"]
    assert base["new_tokens"] == 8 and base["wall_seconds"] == 4.0 and base["tokens_per_second"] == 2.0
    assert base["speedup"] == 1.0 and base["mean_accepted_tokens"] == 1.0
    assert tr["tokens_per_second"] == 4.0 and tr["speedup"] == 2.0
    assert tr["mean_accepted_tokens"] == pytest.approx((4 + 2) / (2 + 1))  # step tokens / steps
    assert base["identical_to_baseline"] == 2 and tr["identical_to_baseline"] == 1 and tr["prompts"] == 2
    assert tr["distribution_check"] is None  # greedy
    assert report["categories"]["qa"]["tr"]["speedup"] == 2.0
    assert set(report["categories"]["rag"]["tr"]) == {"speedup", "mean_accepted_tokens", "tokens_per_second", "speedup_vs_ar"}
    assert tr["speedup_vs_ar"] is None and tr["step_split"] is None  # no ar method, no phase timings
    by_id = {p["id"]: p for p in report["prompts"]}
    assert by_id["a"]["tr"]["identical_to_baseline"] is True and by_id["b"]["tr"]["identical_to_baseline"] is False
    assert set(by_id["a"]["tr"]) == {"new_tokens", "wall_seconds", "mean_accepted_tokens", "identical_to_baseline"}
    json.loads(render(report, "json"))
    md = render(report, "md")
    assert "| tr | 2.00× | 2.00× |" in md
    assert "tr,all,4.0000,2.0000" in render(report, "csv")


def test_ar_ratio_and_step_split():
    """With `ar` in the run every method also gets its speedup over ar; our decoders report how
    their step time splits and the share outside the forward."""
    prompts = [PromptRecord("a", "qa", ("xx",))]
    outputs = {2: [1, 2, 3, 4, 5]}

    def timed(seconds: float, steps: int, phases: dict[str, float]):
        return lambda ids, n: Run(outputs[len(ids)][:n], seconds, steps, phases)

    runners = {
        "baseline": fake_runner(outputs, 4.0, 1.0),
        "ar": timed(2.0, 4, {"draft": 0.0, "forward": 1.8, "verify": 0.1, "update": 0.1}),
        "tr": timed(1.0, 2, {"draft": 0.01, "forward": 0.9, "verify": 0.05, "update": 0.04}),
    }
    report = summarize(run_bench(runners, prompts, encode=lambda h, t: [0] * len(t), decode=str, max_new_tokens=10,
                                 warmup=0), {"model": "fake"})
    tr, ar = report["methods"]["tr"], report["methods"]["ar"]
    assert tr["speedup"] == 4.0 and tr["speedup_vs_ar"] == 2.0 and ar["speedup_vs_ar"] == 1.0
    assert report["methods"]["baseline"]["step_split"] is None
    assert tr["step_split"]["step_ms"] == pytest.approx({"draft": 5.0, "forward": 450.0, "verify": 25.0, "update": 20.0})
    assert tr["step_split"]["outside_forward"] == pytest.approx(0.1)
    assert report["categories"]["qa"]["tr"]["speedup_vs_ar"] == 2.0
    header, body = rows(report)
    assert header[-3:] == ["vs ar", "outside fwd", "identical"]
    assert body[2][-3:] == ["2.00×", "10.0%", "1/1"]


def test_method_names_and_tree_variants():
    from tr_cli.bench.methods import parse_methods, variant_tree

    assert parse_methods(["baseline", "ar", "tr", "tr:paper"]) == ["baseline", "ar", "tr", "tr:paper"]
    for bad in (["bogus"], ["tr:"], ["tr", "tr"], []):
        with pytest.raises(ValueError, match="--methods"):
            parse_methods(bad)
    assert variant_tree("tr:paper") == ("paper", None)
    assert variant_tree("tr:auto+lookup0") == ("auto", 0)
    assert variant_tree("tr:trees/x.json") == ("trees/x.json", None)
    with pytest.raises(ValueError, match="lookup length"):
        variant_tree("tr:paper+lookupX")


def test_sampled_report_checks_distributions_instead_of_tokens():
    """Sampling: no token-by-token comparison; each method's distribution check (sums over every
    counted run) is reported, and the table's last column is its z."""
    prompts = [PromptRecord("a", "qa", ("xx",)), PromptRecord("b", "rag", ("yyy",))]
    outputs = {2: [1, 2, 3, 4, 5], 3: [6, 7, 8]}
    runners = {"baseline": fake_runner(outputs, 2.0, 1.0), "tr": fake_runner(outputs, 1.0, 0.5)}
    seen = []

    def check(ids, tokens):
        seen.append((len(ids), tokens))
        surprisal = 1.5 if len(ids) == 2 else 0.5
        return DistributionCheck(tokens=len(tokens), surprisal=surprisal * len(tokens), entropy=len(tokens),
                                 variance=0.25 * len(tokens))

    results = run_bench(runners, prompts, encode=lambda history, text: [0] * len(text), decode=str,
                        max_new_tokens=10, warmup=1, check=check)
    assert seen == [(2, [1, 2, 3, 4, 5]), (2, [1, 2, 3, 4, 5]), (3, [6, 7, 8]), (3, [6, 7, 8])]  # warmup unchecked
    report = summarize(results, {"model": "fake", "decoding": "sampling: temperature 0.7"}, sampled=True)
    tr = report["methods"]["tr"]
    assert tr["identical_to_baseline"] is None and tr["speedup"] == 2.0
    # (5 * 1.5 + 3 * 0.5 - 8) / sqrt(8 * 0.25) = 1 / sqrt(2)
    assert tr["distribution_check"] == {"tokens": 8, "mean_surprisal": 9 / 8, "mean_entropy": 1.0,
                                        "z": pytest.approx(2 ** -0.5), "outside_support": 0}
    assert all(p["tr"]["identical_to_baseline"] is None for p in report["prompts"])
    md = render(report, "md")
    assert "| dist. z |" in md and "| tr | 2.00× | 2.00× | 2.00 | 4.0 | 2.00× | – | +0.71 |" in md and "identical" not in md
    assert "tr,all,4.0000,2.0000,2.0000,,2,0.7071" in render(report, "csv")


def test_distribution_check_tells_sampling_from_greedy():
    """Tokens sampled from the model's distribution score a z near 0 (about standard normal: this
    seed gives +0.58, the 40 seeds 0..39 average +0.07 with deviation 1.2); greedy tokens under the
    same distribution score far below (they are always the likeliest)."""
    from tiny_models import tiny_model
    from tr_cli.core import StopCondition, TokenRecyclingDecoder
    from tr_cli.core.sampling import SamplingConfig

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
    run_bench({"tr": fake_runner(outputs, 1.0, 1.0)}, prompts, encode, decode=lambda ids: f"reply{ids}",
              max_new_tokens=5, warmup=0)
    assert seen == [[], [("one", "reply[1, 2]")]]


# --- bad input fails before the model loads --------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["missing.jsonl"], "no such prompt file"),
    (["--methods", "baseline,warp"], "unknown method warp"),
    (["--categories", "poetry"], "poetry not in"),
    (["--format", "xml"], "--format xml"),
    (["--turns", "2"], "--turns 2"),
    (["--tree", "paper", "--k", "4"], "uses candidate slot 7"),
    (["--methods", "baseline,tr:bushy"], "unknown tree"),
    (["--methods", "tr:paper+lookupX"], "lookup length must be a number"),
    (["--temperature", "-1"], "--temperature must be 0 (greedy) or more"),
    (["--top-p", "2"], "--top-p must be between 0 and 1"),
    (["--top-k", "-2"], "--top-k must be 0 (off) or more"),
])
def test_bad_input_is_one_line_error(args, words):
    out = runner.invoke(app, ["bench", *args])
    assert out.exit_code == 1 and words in out.output and len(out.output.strip().splitlines()) == 1


def test_empty_prompt_set_after_filters(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n")
    out = runner.invoke(app, ["bench", str(path)])
    assert out.exit_code == 1 and "no prompts left" in out.output


# --- end to end ------------------------------------------------------------------------------

def test_bench_tiny_model_end_to_end(tiny_llama_dir, tmp_path):
    report_path = tmp_path / "report.json"
    out = runner.invoke(app, ["bench", "--model", str(tiny_llama_dir), "--dtype", "float32", "--limit", "2",
                              "-n", "12", "--format", "json", "--output", str(report_path), "--warmup", "0"])
    assert out.exit_code == 0, out.output
    report = json.loads(report_path.read_text())
    assert set(report["methods"]) == {"baseline", "pld", "tr"}
    assert report["methods"]["tr"]["identical_to_baseline"] == 2  # float32: lossless
    assert report["methods"]["baseline"]["prompts"] == 2
    env = report["environment"]
    for key in ("tr_version", "torch", "transformers", "device_name", "dtype", "threads", "model", "tree", "k",
                "max_new_tokens", "matrix", "date"):
        assert key in env
    assert env["model"] == str(tiny_llama_dir) and env["dtype"] == "float32"


def test_sampled_bench_tiny_model_end_to_end(tiny_llama_dir, tmp_path):
    report_path = tmp_path / "report.json"
    out = runner.invoke(app, ["bench", "--model", str(tiny_llama_dir), "--dtype", "float32", "--limit", "2", "-n", "12",
                              "--format", "json", "--output", str(report_path), "--warmup", "0", "--temperature", "0.8",
                              "--top-p", "0.9", "--seed", "5"])
    assert out.exit_code == 0, out.output
    report = json.loads(report_path.read_text())
    env = report["environment"]
    assert env["decoding"] == "sampling: temperature 0.8, top_p 0.9, top_k 50, seed 5" and env["seed"] == 5
    for name in ("baseline", "pld", "tr"):
        method = report["methods"][name]
        assert method["identical_to_baseline"] is None
        check = method["distribution_check"]
        assert check["tokens"] + check["outside_support"] == method["new_tokens"] > 0
        assert abs(check["z"]) < 4, (name, check)
    assert all(p[m]["identical_to_baseline"] is None for p in report["prompts"] for m in ("baseline", "pld", "tr"))


def test_table_report_is_not_squeezed_when_piped(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS")  # a pipe: no terminal width to go by
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"category": "category_{i}", "prompt": "Say {i}."}}\n' for i in range(6)))
    out = runner.invoke(app, ["bench", str(prompts), "--model", str(tiny_llama_dir), "--dtype", "float32", "-n", "4",
                              "--warmup", "0", "--methods", "baseline,tr"])
    assert out.exit_code == 0, out.output
    header = next(line for line in out.stdout.splitlines() if "method" in line)
    for name in [f"category_{i}" for i in range(6)] + ["MAT", "tok/s", "speedup", "identical"]:
        assert name in header


def test_bench_smollm2_two_prompts(smollm2_checkpoint):
    out = runner.invoke(app, ["bench", "--dtype", "float32", "--limit", "2", "-n", "16", "--turns", "1",
                              "--methods", "baseline,tr", "--format", "md", "--warmup", "0"])
    assert out.exit_code == 0, out.output
    table = [line for line in out.stdout.splitlines() if line.startswith("| tr ")]
    assert table and table[0].rstrip().endswith("| 2/2 |"), out.stdout
