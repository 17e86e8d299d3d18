"""`tr bench --plot`: a report drawn as one figure of three panels, readable in black and white
(grey levels, hatches and markers tell the methods apart, not colours alone):

1. tokens/s per method per category (grouped bars), each bar labelled with its speedup over the
   reference method (the report's: transformers' `baseline`, else `baseline@W`; else `ar`, else
   the first method);
2. the tokens each decoding step emitted (share of steps), for the methods that say;
3. tokens/s per prompt.

The title says what the numbers stand on: model, dtype and weights, the CPU and its instruction
set, threads, and the matrix at the start. matplotlib is an optional extra (`tr-cli[plot]`)."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

from ..errors import SettingError, UserError
from ..text.input_text import UnreadableText, read_text_file
from .report import ReportProblem, check_report, target_problem

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
PLOT_EXTRA = "pip install 'tr-cli[plot]'"
_GREYS = ("0.15", "0.55", "0.85", "0.35", "0.7", "1.0", "0.25", "0.95")
_HATCHES = ("", "//", "..", "xx", "\\\\", "++", "--", "oo")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINES = ("-", "--", ":", "-.")
_MOST_TOKENS = 8  # the last bucket of panel 2 holds steps of this many tokens or more


def check_plot_target(path: Path) -> None:
    """Refuse, before any bench runs, a figure that cannot be written: no matplotlib, an
    unknown file type, a missing or read-only directory."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise SettingError("plot", path, f"name a {', '.join(PLOT_SUFFIXES)} file")
    problem = target_problem(path)
    if problem is not None:
        raise SettingError("plot", path, problem)
    if not has_matplotlib():
        raise SettingError("plot", path, f"needs matplotlib, the optional extra: {PLOT_EXTRA}")


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def read_reports(path: Path) -> list[dict]:
    """The passes of a `tr bench --format json` report (one report, or {"passes": [...]})."""
    try:
        data = json.loads(read_text_file(path))
    except UnreadableText as exc:
        raise UserError(f"{exc}; give a report written by tr bench --format json") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read; give a tr bench --format json report") from None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}: line {exc.lineno}: not JSON ({exc.msg}); give a tr bench --format json report"
        ) from None
    except ValueError as exc:  # an integer literal past Python's digit limit
        raise UserError(f"{path}: not JSON ({str(exc).split(';')[0]}); give a tr bench --format json report") from None
    passes = isinstance(data, dict) and "passes" in data
    reports = data["passes"] if passes else [data]
    if passes and (not isinstance(reports, list) or not reports):
        raise UserError(f'{path}: "passes" is not a list of reports; give a report written by tr bench --format json')
    for number, report in enumerate(reports, start=1):
        try:
            check_report(report)
        except ReportProblem as exc:
            where = f"pass {number}: " if passes else ""
            raise UserError(f"{path}: {where}{exc}; give a report written by tr bench --format json") from None
    return reports


def reference_method(report: dict) -> str:
    """The method the bars' speedups are over: the report's (`speedup_over`), else `ar`, else the
    first; an older report, without `speedup_over`, `baseline` first."""
    methods = list(report["methods"])
    recorded = report["environment"].get("speedup_over")
    if recorded in methods:
        return recorded
    for name in ("baseline", "ar"):
        if name in methods:
            return name
    return methods[0]


def draw(report: dict, title_note: str = ""):
    """The report's figure (a matplotlib Figure, not shown anywhere)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    methods = list(report["methods"])
    figure = Figure(figsize=(11, 13.5), layout="constrained")
    rates, steps, prompts = figure.subplots(3, 1)
    figure.suptitle(_title(report["environment"], title_note), fontsize=10, ha="left", x=0.01)
    _rates_by_category(rates, report, methods)
    _tokens_per_step(steps, report, methods)
    _rates_by_prompt(prompts, report, methods)
    return figure


def plot_report(report: dict, path: Path, title_note: str = "") -> None:
    """Draw `report` into `path` (.png, .svg or .pdf)."""
    draw(report, title_note).savefig(path, dpi=130)


def _style(index: int) -> dict:
    return {
        "color": _GREYS[index % len(_GREYS)],
        "hatch": _HATCHES[index % len(_HATCHES)],
        "edgecolor": "black",
        "linewidth": 0.6,
    }


def _title(env: dict, note: str) -> str:
    weights = f"{env.get('dtype', '?')}, {env.get('weights', 'dense')} weights"
    cpu = " ".join(str(env[k]) for k in ("device_name", "cpu_isa") if env.get(k))
    machine = f"{cpu} ({env['threads']} threads)" if env.get("threads") else cpu
    run = [
        env.get("decoding"),
        env.get("max_new_tokens") and f"max {env['max_new_tokens']} new tokens",
        env.get("date"),
    ]
    lines = [
        f"tr bench · {env.get('model', '?')} · {weights} · {machine or env.get('device', '?')}"
        + (f" · {note}" if note else ""),
        f"matrix at start: {env.get('matrix', '?')}",
        " · ".join(str(part) for part in run if part),
    ]
    return "\n".join(textwrap.fill(line, 150, subsequent_indent="  ") for line in lines)


def _rates_by_category(axes, report: dict, methods: list[str]) -> None:
    groups = [*report["categories"], "all"]
    reference = reference_method(report)
    width = 0.8 / len(methods)
    for index, name in enumerate(methods):
        values = [report["categories"][c][name]["tokens_per_second"] for c in groups[:-1]]
        values.append(report["methods"][name]["tokens_per_second"])
        bases = [report["categories"][c][reference]["tokens_per_second"] for c in groups[:-1]]
        bases.append(report["methods"][reference]["tokens_per_second"])
        positions = [g + (index - (len(methods) - 1) / 2) * width for g in range(len(groups))]
        bars = axes.bar(positions, values, width, label=name, **_style(index))
        labels = [f"{v / b:.2f}×" if b else "" for v, b in zip(values, bases, strict=True)]
        axes.bar_label(bars, labels, fontsize=6.5, rotation=90, padding=2)
    axes.set_xticks(range(len(groups)), groups)
    axes.set_ylabel("tokens/s")
    axes.set_title(f"tokens/s by category; labels: speedup over {reference}", fontsize=10, loc="left")
    axes.margins(y=0.18)
    axes.legend(fontsize=8, ncols=min(len(methods), 6), loc="upper left")


def _tokens_per_step(axes, report: dict, methods: list[str]) -> None:
    shown = [name for name in methods if report["methods"][name].get("tokens_per_step")]
    silent = [name for name in methods if name not in shown]
    buckets = list(range(1, _MOST_TOKENS + 1))
    width = 0.8 / max(len(shown), 1)
    for index, name in enumerate(shown):
        counts = {int(n): c for n, c in report["methods"][name]["tokens_per_step"].items()}
        total = sum(counts.values()) or 1
        shares = [
            sum(c for n, c in counts.items() if (n >= b if b == _MOST_TOKENS else n == b)) / total for b in buckets
        ]
        positions = [b + (index - (len(shown) - 1) / 2) * width for b in buckets]
        axes.bar(positions, shares, width, label=name, **_style(methods.index(name)))
    axes.set_xticks(buckets, [str(b) for b in buckets[:-1]] + [f"≥{_MOST_TOKENS}"])
    axes.set_xlabel("tokens emitted by one decoding step (accepted drafts + the model's own token)")
    axes.set_ylabel("share of steps")
    title = "tokens per step"
    if silent:
        title += f" (not reported by {', '.join(silent)})"
    axes.set_title(title, fontsize=10, loc="left")
    if shown:
        axes.legend(fontsize=8, ncols=min(len(shown), 6), loc="upper right")
    else:
        axes.text(0.5, 0.5, "no method in this report says", transform=axes.transAxes, ha="center", fontsize=10)


def _rates_by_prompt(axes, report: dict, methods: list[str]) -> None:
    entries = report["prompts"]
    for index, name in enumerate(methods):
        rates = []
        for entry in entries:
            run = entry.get(name) or {}
            seconds = run.get("wall_seconds") or 0
            rates.append(run.get("new_tokens", 0) / seconds if seconds else float("nan"))
        axes.plot(
            range(len(entries)),
            rates,
            marker=_MARKERS[index % len(_MARKERS)],
            markersize=5,
            linewidth=0.9,
            linestyle=_LINES[index % len(_LINES)],
            color="0.25",  # dark lines; the markers' fill is the method's bar grey
            markerfacecolor=_GREYS[index % len(_GREYS)],
            markeredgecolor="black",
            label=name,
        )
    axes.set_xticks(range(len(entries)), [entry["id"] for entry in entries], rotation=90, fontsize=6)
    axes.set_ylabel("tokens/s")
    axes.set_title("tokens/s per prompt (all turns of a prompt together)", fontsize=10, loc="left")
    axes.legend(fontsize=8, ncols=min(len(methods), 6), loc="best")
