"""Render a bench report as a terminal table, Markdown, CSV or JSON (same numbers in each)."""

from __future__ import annotations

import csv
import io
import json
import platform
from datetime import datetime, timezone

FORMATS = ("table", "md", "csv", "json")


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
            share = drafted.get("grammar", 0) / m["new_tokens"] if drafted is not None and m["new_tokens"] else None
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


def to_markdown(report: dict) -> str:
    header, body = rows(report)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n\n" + environment_line(report["environment"]) + "\n"


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
