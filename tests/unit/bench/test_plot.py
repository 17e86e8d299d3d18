"""`tr bench --plot` and `--from-report` (tr_cli/bench/plot.py): the figure's panels and series
from a report, the files it writes, its one-line refusals (a report's inner keys and types checked
before anything prints: bench/report.py's check_report); and the per-step token counts the
report carries (from a real decoder on a tiny model)."""

import copy
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import matplotlib.image
import pytest
from typer.testing import CliRunner

from tr_cli.bench.methods import HFGenerate, TokenRecycling
from tr_cli.bench.metrics import summarize
from tr_cli.bench.plot import check_plot_target, draw, plot_report, read_reports
from tr_cli.bench.report import ReportProblem, check_report, render_passes
from tr_cli.bench.run import Run
from tr_cli.bench.runner import run_bench
from tr_cli.cli import app
from tr_cli.core import TokenRecyclingDecoder
from tr_cli.errors import SettingError, UserError
from tr_cli.text.prompts import PromptRecord

from tiny_models import EOS, random_prompt, tiny_model

PROMPTS = [PromptRecord("a", "qa", ("xx",)), PromptRecord("b", "rag", ("yyy",)), PromptRecord("c", "qa", ("zzzz",))]


def _runner(seconds: float, per_step: Counter | None):
    def run(ids, max_new_tokens, grammar):
        tokens = list(range(1, 9))[:max_new_tokens]
        steps = sum(per_step.values()) if per_step else len(tokens) - 1
        return Run(tokens, seconds * len(ids), steps, tokens_per_step=per_step)

    return run


def _report() -> dict:
    runners = {
        "baseline": _runner(1.0, Counter({1: 7})),
        "pld": _runner(0.8, None),  # says nothing of its steps
        "tr": _runner(0.5, Counter({1: 1, 2: 1, 4: 1})),
    }
    results = run_bench(runners, PROMPTS, encode=lambda h, t: [0] * len(t), decode=str, max_new_tokens=8, warmup=0)
    env = {"model": "tiny", "dtype": "float32", "weights": "dense", "device_name": "AMD EPYC", "cpu_isa": "AVX2"}
    return summarize(results, {**env, "threads": 2, "matrix": "empty (cold)"})


def test_the_report_counts_the_tokens_each_step_emitted():
    report = _report()
    assert report["methods"]["tr"]["tokens_per_step"] == {"1": 3, "2": 3, "4": 3}  # three prompts
    assert report["methods"]["baseline"]["tokens_per_step"] == {"1": 21}
    assert report["methods"]["pld"]["tokens_per_step"] is None


def test_our_decoders_and_generate_count_steps_by_tokens_emitted():
    model = tiny_model("llama")
    ids = random_prompt(12, 3)
    for runner in (TokenRecycling(TokenRecyclingDecoder(model), [EOS]), HFGenerate(model, [EOS], prompt_lookup=False)):
        run = runner.run(ids, 30)
        counts = run.tokens_per_step
        assert sum(counts.values()) == run.steps
        assert sum(n * c for n, c in counts.items()) == run.step_tokens  # every token after the prefill's


def test_the_figure_has_a_panel_each_and_a_series_per_method():
    report = _report()
    figure = draw(report)
    rates, steps, prompts = figure.axes
    assert len(rates.containers) == 3 and all(len(c) == 3 for c in rates.containers)  # qa, rag, all
    labels = [t.get_text() for t in rates.texts]
    assert labels.count("1.00×") == 3 and "2.00×" in labels  # over baseline: tr is twice as fast
    assert len(steps.containers) == 2 and "not reported by pld" in steps.get_title(loc="left")  # baseline and tr
    assert len(prompts.lines) == 3 and [t.get_text() for t in prompts.get_xticklabels()] == ["a", "b", "c"]
    title = figure.get_suptitle()
    assert "tiny" in title and "float32, dense weights" in title and "AMD EPYC AVX2 (2 threads)" in title
    assert "matrix at start: empty (cold)" in title


def test_png_and_svg_files(tmp_path):
    report = _report()
    plot_report(report, tmp_path / "r.png")
    height, width, _ = matplotlib.image.imread(tmp_path / "r.png").shape
    assert width > 1000 and height > width
    plot_report(report, tmp_path / "r.svg")
    root = ET.parse(tmp_path / "r.svg").getroot()
    axes = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("id", "").startswith("axes_")]
    assert len(axes) == 3


def test_a_plot_target_that_cannot_be_written_is_refused_first(tmp_path, monkeypatch):
    with pytest.raises(SettingError, match=r"name a \.png, \.svg, \.pdf file"):
        check_plot_target(tmp_path / "r.jpg")
    with pytest.raises(SettingError, match="does not exist"):
        check_plot_target(tmp_path / "nowhere" / "r.png")
    # A directory nothing can be written to, also as root: the bench used to run to its end first.
    with pytest.raises(SettingError, match=r"^plot /proc/r.png: cannot be written here"):
        check_plot_target(Path("/proc/r.png"))
    (tmp_path / "d.png").mkdir()
    with pytest.raises(SettingError, match="is a directory"):
        check_plot_target(tmp_path / "d.png")
    monkeypatch.setattr("tr_cli.bench.plot.has_matplotlib", lambda: False)
    with pytest.raises(SettingError, match=r"needs matplotlib, the optional extra: pip install 'tr-cli\[plot\]'"):
        check_plot_target(tmp_path / "r.png")


def test_reports_are_read_back_or_refused_in_one_line(tmp_path):
    report = _report()
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(render_passes([report], "json"))
    two.write_text(render_passes([report, report], "json"))
    assert read_reports(one) == [json.loads(one.read_text())]
    assert len(read_reports(two)) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"passes": [\n{"methods": }]}')
    with pytest.raises(UserError, match=r"bad.json: line 2: not JSON"):
        read_reports(bad)
    bad.write_text('{"methods": {}}')
    with pytest.raises(UserError, match="the report: lacks environment, categories, prompts"):
        read_reports(bad)


def test_from_report_prints_and_plots_without_running(tmp_path):
    saved = tmp_path / "r.json"
    saved.write_text(render_passes([_report(), _report()], "json"))
    result = CliRunner().invoke(
        app, ["bench", "--from-report", str(saved), "--plot", str(tmp_path / "p.svg"), "--format", "md"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("| tr |") == 2  # both passes, from the file
    assert (tmp_path / "p-pass1.svg").is_file() and (tmp_path / "p-pass2.svg").is_file()


# --- a report read back whose inner keys or types are wrong -----------------------------------


def _broken(how: str) -> dict:
    report = copy.deepcopy(_report())
    if how == "methods as a list":
        report["methods"] = list(report["methods"].values())
    elif how == "no tokens_per_second":
        del report["methods"]["tr"]["tokens_per_second"]
    elif how == "prompt without id":
        del report["prompts"][1]["id"]
    elif how == "a string for a number":
        report["methods"]["tr"]["speedup"] = "fast"
    elif how == "a null for a number":
        report["categories"]["qa"]["tr"]["tokens_per_second"] = None
    elif how == "empty methods":
        report["methods"] = {}
    elif how == "a category without a method":
        del report["categories"]["rag"]["pld"]
    elif how == "a count that is a fraction":
        report["methods"]["tr"]["prompts"] = 2.5
    elif how == "tokens per step keyed by words":
        report["methods"]["tr"]["tokens_per_step"] = {"one": 3}
    elif how == "NaN for a number":  # json writes and reads NaN: the bars crashed on it ('unexpected ValueError')
        report["methods"]["tr"]["tokens_per_second"] = float("nan")
    elif how == "Infinity for a number":
        report["categories"]["qa"]["tr"]["speedup"] = float("inf")
    return report


CASES = {
    "methods as a list": "methods: expected a JSON object, got a list",
    "no tokens_per_second": "methods.tr: lacks tokens_per_second",
    "prompt without id": "prompts[2]: lacks id",
    "a string for a number": "methods.tr.speedup: expected a number, got text ('fast')",
    "a null for a number": "categories.qa.tr.tokens_per_second: expected a number, got null",
    "empty methods": "methods: empty; a report has at least one method",
    "a category without a method": "categories.rag: lacks pld",
    "a count that is a fraction": "methods.tr.prompts: expected a whole number, got a fraction",
    "tokens per step keyed by words": "methods.tr.tokens_per_step: 'one' is not a count of tokens",
    "NaN for a number": "methods.tr.tokens_per_second: expected a number, got NaN",
    "Infinity for a number": "categories.qa.tr.speedup: expected a number, got Infinity",
}


@pytest.mark.parametrize("how", CASES)
def test_a_wrong_report_names_its_field(how):
    with pytest.raises(ReportProblem) as caught:
        check_report(_broken(how))
    assert str(caught.value).startswith(CASES[how]), str(caught.value)


def test_a_real_report_passes():
    check_report(json.loads(json.dumps(_report())))  # as read back from the file


@pytest.mark.parametrize("fmt", ["table", "md", "csv", "json"])
@pytest.mark.parametrize("how", CASES)
def test_from_report_prints_nothing_of_a_wrong_report(tmp_path, how, fmt):
    saved = tmp_path / "r.json"
    saved.write_text(render_passes([_report(), _broken(how)], "json"))
    out = CliRunner().invoke(app, ["bench", "--from-report", str(saved), "--format", fmt])
    assert out.exit_code == 1, out.output
    assert out.output.strip().splitlines() == [
        f"tr: error: {saved}: pass 2: {out.output.split('pass 2: ', 1)[1].strip()}"
    ]
    assert CASES[how] in out.output and "give a report written by tr bench --format json" in out.output
    assert "unexpected" not in out.output


def test_an_unwritable_plot_is_refused_before_the_bench_runs(tmp_path):
    out = CliRunner().invoke(app, ["bench", "--plot", "/proc/r.png", "--limit", "1"])
    assert out.exit_code == 1 and out.output.strip().splitlines() == [
        "tr: error: --plot /proc/r.png: cannot be written here (permissions or a read-only file system)"
    ]


def test_a_huge_integer_in_a_report_is_one_line(tmp_path):
    saved = tmp_path / "r.json"
    saved.write_text('{"methods": ' + "9" * 5000 + "}")
    out = CliRunner().invoke(app, ["bench", "--from-report", str(saved)])
    assert out.exit_code == 1 and "not JSON (Exceeds the limit (4300 digits)" in out.output, out.output
