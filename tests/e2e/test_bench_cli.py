"""`tr bench` as a user runs it: one-line errors before the model loads, and real end-to-end runs
on a tiny random model and on SmolLM2."""

import json

import pytest
from typer.testing import CliRunner

from tr_cli.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def plain_output(home, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


# --- bad input fails before the model loads --------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["missing.jsonl"], "no such prompt file"),
        (["--methods", "baseline,warp"], "--methods warp: unknown method"),
        (["--categories", "poetry"], "poetry not in"),
        (["--format", "xml"], "--format xml"),
        (["--turns", "2"], "--turns 2"),
        (["--tree", "paper", "--k", "4"], "uses candidate slot 7"),
        (["--methods", "baseline,tr:bushy"], "unknown tree"),
        (["--methods", "tr:paper+lookupX"], "--methods tr:paper+lookupX: tree paper+lookupX: unknown tree"),
        (["--methods", "baseline@fp16"], "--methods baseline@fp16: weights fp16: unknown; use @int8"),
        (["--temperature", "-1"], "--temperature -1.0: must be 0 (greedy) or more"),
        (["--top-p", "2"], "--top-p 2.0: must be between 0 and 1"),
        (["--top-k", "-2"], "--top-k -2: must be 0 (off) or more"),
    ],
)
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
    out = runner.invoke(
        app,
        [
            "bench",
            "--model",
            str(tiny_llama_dir),
            "--dtype",
            "float32",
            "--limit",
            "2",
            "-n",
            "12",
            "--format",
            "json",
            "--output",
            str(report_path),
            "--warmup",
            "0",
        ],
    )
    assert out.exit_code == 0, out.output
    report = json.loads(report_path.read_text())
    assert set(report["methods"]) == {"baseline", "pld", "tr"}
    assert report["methods"]["tr"]["identical_to_baseline"] == 2  # float32: lossless
    assert report["methods"]["baseline"]["prompts"] == 2
    # generate (through its streamer hook) and tr say when their first token came, so each has a
    # rate after it (the prefill left out).
    for name in ("baseline", "tr"):
        assert report["methods"][name]["decode_tokens_per_second"] > 0
    assert report["methods"]["baseline"]["decode_speedup"] == 1.0 and report["methods"]["tr"]["decode_speedup"] > 0
    env = report["environment"]
    for key in (
        "tr_version",
        "torch",
        "transformers",
        "device_name",
        "dtype",
        "threads",
        "model",
        "tree",
        "k",
        "max_new_tokens",
        "matrix",
        "date",
    ):
        assert key in env
    assert env["model"] == str(tiny_llama_dir) and env["dtype"] == "float32"


def test_passes_report_a_repeated_workload_apart(tiny_llama_dir, tmp_path):
    """--passes 2: the same prompts twice, learning kept; the second pass drafts from the store
    the first pass filled (the prompts' conversations), and each pass is reported on its own."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three four five six seven eight\n\nnine ten eleven twelve thirteen fourteen\n")
    report_path = tmp_path / "report.json"
    args = ["bench", str(prompts), "--model", str(tiny_llama_dir), "--dtype", "float32", "-n", "24"]
    # A fixed plan verifies every store draft: a designed one prices them by this machine's t(N)
    # and by how often the store was right before (never, in pass 1), so whether it tries them in
    # pass 2 depends on the machine and its load.
    args += ["--tree", "none+store24", "--methods", "baseline,tr", "--passes", "2", "--warmup", "0"]
    args += ["--format", "json", "-o", str(report_path)]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    passes = json.loads(report_path.read_text())["passes"]
    assert [p["environment"]["pass"] for p in passes] == ["1 of 2", "2 of 2"]
    assert "repeated workload" in passes[1]["environment"]["matrix"]
    assert all(p["methods"]["tr"]["identical_to_baseline"] == 2 for p in passes)  # float32: lossless
    # The second pass has every answer in the store: it accepts more per step.
    first, second = (p["methods"]["tr"]["mean_accepted_tokens"] for p in passes)
    assert second > first
    md = runner.invoke(app, [*args[:-4], "--format", "md"])
    assert md.exit_code == 0 and md.output.count("### pass") == 2


def test_sampled_bench_tiny_model_end_to_end(tiny_llama_dir, tmp_path):
    report_path = tmp_path / "report.json"
    out = runner.invoke(
        app,
        [
            "bench",
            "--model",
            str(tiny_llama_dir),
            "--dtype",
            "float32",
            "--limit",
            "2",
            "-n",
            "12",
            "--format",
            "json",
            "--output",
            str(report_path),
            "--warmup",
            "0",
            "--temperature",
            "0.8",
            "--top-p",
            "0.9",
            "--seed",
            "5",
        ],
    )
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
    out = runner.invoke(
        app,
        [
            "bench",
            str(prompts),
            "--model",
            str(tiny_llama_dir),
            "--dtype",
            "float32",
            "-n",
            "4",
            "--warmup",
            "0",
            "--methods",
            "baseline,tr",
        ],
    )
    assert out.exit_code == 0, out.output
    header = next(line for line in out.stdout.splitlines() if "method" in line)
    for name in [f"category_{i}" for i in range(6)] + ["MAT", "tok/s", "speedup", "identical"]:
        assert name in header


def test_bf16_reference_beside_the_loaded_model(tiny_llama_dir, tmp_path):
    """baseline@bf16 runs generate on the file loaded again, dense bfloat16: its own reference
    for identical tokens, recorded in the environment; without `baseline`, speedups are over it."""
    report_path = tmp_path / "report.json"
    args = ["bench", "--model", str(tiny_llama_dir), "--dtype", "float32", "--limit", "2", "-n", "12", "--warmup", "0"]
    out = runner.invoke(
        app, [*args, "--methods", "baseline,baseline@bf16,tr", "--format", "json", "-o", str(report_path)]
    )
    assert out.exit_code == 0, out.output
    report = json.loads(report_path.read_text())
    env, methods = report["environment"], report["methods"]
    assert env["dtype"] == "float32" and env["speedup_over"] == "baseline"
    assert env["variant_loads"] == {"bf16": {"dtype": "bfloat16", "weights": "dense", "second_load": True}}
    assert methods["baseline@bf16"]["identical_to_baseline"] == 2  # against itself
    assert methods["tr"]["identical_to_baseline"] == 2  # against the float32 baseline: lossless
    assert methods["baseline"]["speedup"] == 1.0 and methods["baseline@bf16"]["speedup"] > 0

    out = runner.invoke(app, [*args[:-4], "--limit", "1", "--warmup", "0", "--methods", "baseline@bf16,ar,tr"])
    assert out.exit_code == 0, out.output
    assert "tr bench: speedup over transformers greedy (baseline@bf16)" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("│ baseline@bf16 "))
    cells = [cell.strip() for cell in row.split("│")]
    assert cells[5:7] == ["1.00×", "1.00×"] and "1/1" in cells  # speedup, decode; identical to itself
    assert "variant_loads: @bf16 dense bfloat16 (a second load)" in " ".join(out.stdout.split())


def test_bench_smollm2_two_prompts(smollm2_checkpoint):
    out = runner.invoke(
        app,
        [
            "bench",
            "--limit",
            "2",
            "-n",
            "16",
            "--turns",
            "1",
            "--methods",
            "baseline,tr",
            "--format",
            "md",
            "--warmup",
            "0",
        ],
    )
    assert out.exit_code == 0, out.output
    table = [line for line in out.stdout.splitlines() if line.startswith("| tr ")]
    assert table and table[0].rstrip().endswith("| 2/2 |"), out.stdout


# --- limits and output faults ----------------------------------------------------------------


def test_output_that_is_a_directory_is_refused_before_the_model_loads(tmp_path):
    out = runner.invoke(app, ["bench", "--output", str(tmp_path)])
    assert out.exit_code == 1 and "is a directory" in out.output and len(out.output.strip().splitlines()) == 1


def test_prompts_past_the_context_are_skipped_with_a_warning_and_reported(small_context_model, tmp_path):
    model = small_context_model(256)
    prompts = tmp_path / "prompts.jsonl"
    records = [
        {"question_id": "short", "category": "qa", "turns": ["What is a cat?"]},
        {"question_id": "long", "category": "qa", "turns": ["cat " * 300]},
        # Each turn fits alone; the conversation with its first reply does not.
        {"question_id": "two-turn", "category": "qa", "turns": ["dog " * 60, "and again " * 20]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    report_path = tmp_path / "report.json"
    args = ["bench", str(prompts), "--model", str(model), "--dtype", "float32", "-n", "64", "--warmup", "0"]
    out = runner.invoke(app, [*args, "--methods", "baseline,tr", "--format", "json", "--output", str(report_path)])
    assert out.exit_code == 0, out.output
    warnings = [line for line in out.output.splitlines() if "skipped" in line]
    assert len(warnings) == 2 and "prompt long skipped" in warnings[0] and "context holds 256" in warnings[0]
    assert "prompt two-turn skipped" in warnings[1]
    report = json.loads(report_path.read_text())
    assert report["methods"]["baseline"]["prompts"] == 1 and report["methods"]["tr"]["prompts"] == 1
    assert report["environment"]["skipped"] == "2 over the context (long, two-turn)"
    # With no prompt left, nothing runs.
    prompts.write_text(json.dumps(records[1]) + "\n")
    out = runner.invoke(app, [*args, "--methods", "baseline"])
    assert out.exit_code == 1 and "no prompt fits the model's context of 256 tokens" in out.output


def test_a_report_that_cannot_be_written_is_printed_instead(tiny_llama_dir, tmp_path):
    """The write fails after the whole run (a full disk: /dev/full): the measurements go to
    stdout, and the command says so and fails."""
    args = ["bench", "--model", str(tiny_llama_dir), "--dtype", "float32", "--limit", "1", "-n", "8"]
    out = runner.invoke(app, [*args, "--warmup", "0", "--methods", "baseline", "--format", "json", "-o", "/dev/full"])
    assert out.exit_code == 1
    assert "--output /dev/full: the report could not be written (" in out.output
    assert "it was printed to stdout instead" in out.output
    report = json.loads(out.stdout[: out.stdout.rindex("}") + 1])
    assert report["methods"]["baseline"]["prompts"] == 1
