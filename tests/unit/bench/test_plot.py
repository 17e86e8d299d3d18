"""`tr bench --plot` and `--from-report` (tr_cli/bench/plot.py): the figure's panels and series
from a report, the files it writes, its one-line refusals; and the per-step token counts the
report carries (from a real decoder on a tiny model)."""

import json
import xml.etree.ElementTree as ET
from collections import Counter

import matplotlib.image
import pytest
from typer.testing import CliRunner

from tr_cli.bench.methods import HFGenerate, TokenRecycling
from tr_cli.bench.metrics import summarize
from tr_cli.bench.plot import check_plot_target, draw, plot_report, read_reports
from tr_cli.bench.report import render_passes
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
    with pytest.raises(UserError, match="the report lacks environment, methods, categories or prompts"):
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
