"""Render a bench report as a terminal table, Markdown, CSV or JSON (same numbers in each)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path

FORMATS = ("table", "md", "csv", "json")


def target_problem(path: Path) -> str | None:
    """Why a report or figure cannot be written to `path`, checked before a bench runs (not after
    it); None when it can."""
    if path.is_dir():
        return "is a directory; name a file"
    if not path.parent.is_dir():
        return f"directory {path.parent} does not exist"
    if path.exists():
        writable = os.access(path, os.W_OK)
    else:  # a file made and removed: os.access says yes to root, even where nothing can be made (/proc)
        try:
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tr-probe-"):
                writable = True
        except OSError:
            writable = False
    if not writable:
        return "cannot be written here (permissions or a read-only file system)"
    return None


def environment(**fields) -> dict:
    """The run's circumstances, recorded with its numbers."""
    import torch  # here, not above: reading, printing and plotting a report needs no torch
    import transformers

    from .. import __version__

    return {
        "tr_version": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **fields,
    }


_NUMBER = "a number"
_COUNT = "a whole number"
# What printing and plotting a report read, field by field: (field, kind, may be null).
_METHOD_FIELDS = (
    ("tokens_per_second", _NUMBER, False),
    ("mean_accepted_tokens", _NUMBER, False),
    ("speedup", _NUMBER, True),
    ("prompts", _COUNT, False),
    ("identical_to_baseline", _COUNT, True),
)
_OPTIONAL_METHOD_FIELDS = (
    ("decode_speedup", _NUMBER),
    ("speedup_vs_ar", _NUMBER),
    ("new_tokens", _NUMBER),
    ("wall_seconds", _NUMBER),
)
_CATEGORY_FIELDS = (
    ("tokens_per_second", _NUMBER, False),
    ("mean_accepted_tokens", _NUMBER, False),
    ("speedup", _NUMBER, True),
)


class ReportProblem(ValueError):
    """A report (read back with --from-report) that tables and plots cannot be drawn from: the
    message names the field (e.g. methods.tr.tokens_per_second) and what it should be."""


def check_report(report: object) -> None:
    """Refuse, as one ReportProblem, a report whose shape or values the renderings and the plot
    cannot use, before any of it is printed: every field they read, checked for its type."""
    report = _mapping(report, "the report", ("environment", "methods", "categories", "prompts"))
    _mapping(report["environment"], "environment")
    methods = _mapping(report["methods"], "methods")
    if not methods:
        raise ReportProblem("methods: empty; a report has at least one method")
    for name, method in methods.items():
        where = f"methods.{name}"
        method = _mapping(method, where)
        for field, kind, nullable in _METHOD_FIELDS:
            _value(method, field, kind, where, nullable=nullable, required=True)
        for field, kind in _OPTIONAL_METHOD_FIELDS:
            _value(method, field, kind, where, nullable=True, required=False)
        if method.get("step_split") is not None:
            _value(_mapping(method["step_split"], f"{where}.step_split"), "outside_forward", _NUMBER, where)
        for field in ("drafted_tokens", "verified_nodes", "tokens_per_step"):
            counts = _mapping(method.get(field) or {}, f"{where}.{field}")
            for key in counts:
                _value(counts, key, _NUMBER, f"{where}.{field}", nullable=False)
                if field == "tokens_per_step" and not key.isdigit():
                    raise ReportProblem(f"{where}.tokens_per_step: {key!r} is not a count of tokens (1, 2, ...)")
        if method.get("distribution_check") is not None:
            check = _mapping(method["distribution_check"], f"{where}.distribution_check")
            _value(check, "z", _NUMBER, f"{where}.distribution_check")
            _value(check, "outside_support", _COUNT, f"{where}.distribution_check")
    for category, by_method in _mapping(report["categories"], "categories").items():
        by_method = _mapping(by_method, f"categories.{category}", tuple(methods))
        for name in methods:
            entry = _mapping(by_method[name], f"categories.{category}.{name}")
            for field, kind, nullable in _CATEGORY_FIELDS:
                _value(entry, field, kind, f"categories.{category}.{name}", nullable=nullable, required=True)
    if not isinstance(report["prompts"], list):
        raise ReportProblem(f"prompts: expected a list, got {_kind(report['prompts'])}")
    for number, entry in enumerate(report["prompts"], start=1):
        where = f"prompts[{number}]"
        entry = _mapping(entry, where, ("id",))
        if not isinstance(entry["id"], (str, int)) or isinstance(entry["id"], bool):
            raise ReportProblem(f"{where}.id: expected text, got {_kind(entry['id'])}")
        for name in methods:
            if entry.get(name) is not None:
                run = _mapping(entry[name], f"{where}.{name}")
                for field in ("new_tokens", "wall_seconds"):
                    _value(run, field, _NUMBER, f"{where}.{name}")
    variants = report["environment"].get("variant_loads")
    if variants is not None:
        for suffix, load in _mapping(variants, "environment.variant_loads").items():
            _mapping(load, f"environment.variant_loads.{suffix}", ("weights", "dtype", "second_load"))


def _mapping(value: object, where: str, keys: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise ReportProblem(f"{where}: expected a JSON object, got {_kind(value)}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise ReportProblem(f"{where}: lacks {', '.join(missing)}")
    return value


def _value(entry: dict, field: str, kind: str, where: str, nullable: bool = True, required: bool = False) -> None:
    if field not in entry:
        if required:
            raise ReportProblem(f"{where}: lacks {field}")
        return
    value = entry[field]
    if value is None:
        if not nullable:
            raise ReportProblem(f"{where}.{field}: expected {kind}, got null")
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # Python's json reads NaN and Infinity, which tr bench never writes: the bars and the plot
    # cannot scale by them.
    finite = number and (isinstance(value, int) or math.isfinite(value))
    if not finite or (kind == _COUNT and not isinstance(value, int)):
        raise ReportProblem(f"{where}.{field}: expected {kind}, got {_kind(value)}")


def _kind(value: object) -> str:
    names = {bool: "true/false", str: "text", list: "a list", dict: "a JSON object", float: "a fraction"}
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"  # as JSON spells them
    shown = f" ({value[:40]!r})" if isinstance(value, str) else ""
    return names.get(type(value), type(value).__name__) + shown


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def sampled(report: dict) -> bool:
    return report["environment"].get("decoding", "greedy") != "greedy"


def _distribution_cell(check: dict | None) -> str:
    """z of the distribution check (about N(0, 1) for an exact sampler), and tokens outside the
    check's support, if any."""
    if not check or check.get("z") is None:
        return "–"
    outside = f" ({check['outside_support']} outside)" if check.get("outside_support") else ""
    return f"{check['z']:+.2f}{outside}"


def rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """The paper-style table: methods as rows, per-category speedups, then MAT, tok/s, speedup, and
    the identical-output count (greedy) or the distribution check's z (sampling)."""
    categories = list(report["categories"])
    with_ar = any(m.get("speedup_vs_ar") is not None for m in report["methods"].values())
    # The speedup after the first token (the prefill every method pays alike left out).
    with_decode = any(m.get("decode_speedup") is not None for m in report["methods"].values())
    # Structured prompts: the share of new tokens the grammar's forced-token chain drafted.
    with_grammar = any((m.get("drafted_tokens") or {}).get("grammar") for m in report["methods"].values())
    header = [
        "method",
        *categories,
        "MAT",
        "tok/s",
        "speedup",
        *(["decode"] if with_decode else []),
        *(["vs ar"] if with_ar else []),
        *(["from grammar"] if with_grammar else []),
        "outside fwd",
        "dist. z" if sampled(report) else "identical",
    ]
    body = []
    for name, m in report["methods"].items():
        split = m.get("step_split") or {}
        outside = _fmt(100 * split["outside_forward"], 1, "%") if split.get("outside_forward") is not None else "–"
        extra = [_fmt(m.get("decode_speedup"), 2, "×")] if with_decode else []
        extra += [_fmt(m.get("speedup_vs_ar"), 2, "×")] if with_ar else []
        if with_grammar:
            drafted = m.get("drafted_tokens")
            share = drafted.get("grammar", 0) / m["new_tokens"] if drafted is not None and m.get("new_tokens") else None
            extra.append(_fmt(None if share is None else 100 * share, 1, "%"))
        cells = [_fmt(report["categories"][c][name]["speedup"], 2, "×") for c in categories]
        if sampled(report):
            last = _distribution_cell(m.get("distribution_check"))
        else:
            last = "–" if m["identical_to_baseline"] is None else f"{m['identical_to_baseline']}/{m['prompts']}"
        body.append(
            [
                name,
                *cells,
                _fmt(m["mean_accepted_tokens"]),
                _fmt(m["tokens_per_second"], 1),
                _fmt(m["speedup"], 2, "×"),
                *extra,
                outside,
                last,
            ]
        )
    return header, body


def _variant_loads(loads: dict[str, dict]) -> str:
    """'@bf16 dense bfloat16 (a second load)': what each `@bf16`-like variant ran on."""
    where = {True: "a second load", False: "the bench's own load"}
    return ", ".join(
        f"@{suffix} {load['weights']} {load['dtype']} ({where[load['second_load']]})" for suffix, load in loads.items()
    )


def environment_line(env: dict) -> str:
    keys = (
        "model",
        "dtype",
        "weights",
        "variant_loads",
        "speedup_over",
        "device_name",
        "cpu_isa",
        "threads",
        "tree",
        "trees",
        "k",
        "decoding",
        "seed",
        "max_new_tokens",
        "skipped",
        "pass",
        "matrix",
        "llama_cpp",
        "torch",
        "transformers",
        "tr_version",
        "date",
    )
    shown = {**env, "variant_loads": _variant_loads(env["variant_loads"]) if env.get("variant_loads") else None}
    return " · ".join(f"{k}: {shown[k]}" for k in keys if shown.get(k) is not None)


def sources_line(report: dict) -> str | None:
    """Each draft source's acceptance per method, accepted of verified nodes ('tr: matrix 115/402
    29%, lookup ...'); None where no method says (older reports, methods that do not draft)."""
    parts = []
    for name, m in report["methods"].items():
        verified, accepted = m.get("verified_nodes") or {}, m.get("drafted_tokens") or {}
        cells = [
            f"{source} {accepted.get(source, 0)}/{count} {100 * accepted.get(source, 0) / count:.0f}%"
            for source, count in verified.items()
            if count
        ]
        if cells:
            parts.append(f"{name}: {', '.join(cells)}")
    return "draft nodes accepted/verified by source · " + " · ".join(parts) if parts else None


def to_markdown(report: dict) -> str:
    header, body = rows(report)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    sources = sources_line(report)
    below = [environment_line(report["environment"]), *([sources] if sources else [])]
    return "\n".join(lines) + "\n\n" + "\n\n".join(below) + "\n"


def to_csv(report: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        [
            "method",
            "category",
            "tokens_per_second",
            "speedup",
            "mean_accepted_tokens",
            "identical_to_baseline",
            "prompts",
            "distribution_z",
        ]
    )
    for name, m in report["methods"].items():
        check = m.get("distribution_check") or {}
        writer.writerow(
            [
                name,
                "all",
                f"{m['tokens_per_second']:.4f}",
                _fmt(m["speedup"], 4),
                f"{m['mean_accepted_tokens']:.4f}",
                "" if m["identical_to_baseline"] is None else m["identical_to_baseline"],
                m["prompts"],
                "" if check.get("z") is None else f"{check['z']:.4f}",
            ]
        )
    for category, methods in report["categories"].items():
        for name, c in methods.items():
            writer.writerow(
                [
                    name,
                    category,
                    f"{c['tokens_per_second']:.4f}",
                    _fmt(c["speedup"], 4),
                    f"{c['mean_accepted_tokens']:.4f}",
                    "",
                    "",
                    "",
                ]
            )
    return out.getvalue()


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def render_passes(reports: list[dict], fmt: str) -> str:
    """Several passes over the same prompts (a repeated workload), each reported on its own."""
    if len(reports) == 1:
        return render(reports[0], fmt)
    if fmt == "json":
        return to_json({"passes": reports})
    if fmt == "md":
        return "\n".join(f"### pass {i}\n\n" + to_markdown(r) for i, r in enumerate(reports, start=1))
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        for i, report in enumerate(reports, start=1):
            table = list(csv.reader(io.StringIO(to_csv(report))))
            writer.writerows(([("pass", *table[0])] if i == 1 else []) + [(str(i), *row) for row in table[1:]])
        return out.getvalue()
    raise ValueError(f"no text rendering for {fmt}")


def render(report: dict, fmt: str) -> str:
    if fmt == "md":
        return to_markdown(report)
    if fmt == "csv":
        return to_csv(report)
    if fmt == "json":
        return to_json(report)
    raise ValueError(f"no text rendering for {fmt}")
