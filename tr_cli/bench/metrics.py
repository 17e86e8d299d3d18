"""Aggregate bench results into the stable report structure (the `--format json` schema)."""

from __future__ import annotations

from collections import Counter

from ..core.events import StepTimings, mean_accepted_tokens, tokens_per_second
from .distribution import DistributionCheck
from .methods import counterpart, speedup_reference
from .runner import Measured, PromptResult


def _rate(items: list[Measured]) -> float:
    return tokens_per_second(sum(m.new_tokens for m in items), sum(m.seconds for m in items))


def _decode_rate(items: list[Measured]) -> float | None:
    """Tokens per second after each turn's first token: the decoding alone, without the prefill
    that every method pays alike (None where a method does not say when its first token came)."""
    if not items or any(m.first_token_seconds is None for m in items):
        return None
    seconds = sum(m.seconds - m.first_token_seconds for m in items)
    return tokens_per_second(sum(m.step_tokens for m in items), seconds)


def _mat(items: list[Measured]) -> float:
    return mean_accepted_tokens(sum(m.step_tokens for m in items), sum(m.steps for m in items))


def _step_split(items: list[Measured]) -> dict | None:
    """Mean ms per step of each phase of our decoder, and the share outside the model's forward."""
    timed = [m for m in items if m.timings is not None]
    steps = sum(m.steps for m in timed)
    if not timed or not steps:
        return None
    total = sum((m.timings for m in timed), StepTimings())
    return {"step_ms": total.ms_per_step(steps), "outside_forward": total.outside_forward}


def _check(items: list[Measured]) -> dict | None:
    checks = [m.check for m in items if m.check is not None]
    if not checks:
        return None
    total = DistributionCheck()
    for check in checks:
        total.add(check)
    return total.to_json()


def _tokens_per_step(items: list[Measured]) -> dict[str, int] | None:
    """Steps by how many tokens each emitted ({"1": steps, "2": ...}), where the method says."""
    if not items or any(m.tokens_per_step is None for m in items):
        return None
    total = sum((m.tokens_per_step for m in items), Counter())
    return {str(n): total[n] for n in sorted(total)}


def _by_source(items: list[Measured], counts: str) -> dict[str, int] | None:
    """A count by draft source (matrix, lookup, store, grammar) summed over the items: `drafted`
    (emitted draft tokens) or `verified` (draft nodes verified)."""
    if not items or any(getattr(m, counts) is None for m in items):
        return None
    total = sum((getattr(m, counts) for m in items), Counter())
    return {source: total[source] for source in sorted(total)}


def summarize(results: list[PromptResult], environment: dict, sampled: bool = False) -> dict:
    """The report. Speedups are over speedup_reference's method, which the environment records
    (`speedup_over`). Sampled outputs are never compared token by token (identical_to_baseline
    is None); each method's distribution_check says instead whether its tokens fit the model's
    distribution."""
    methods = list(results[0].methods) if results else []
    reference = speedup_reference(methods)

    def block(name: str, subset: list[PromptResult]) -> dict:
        items = [r.methods[name] for r in subset]
        rate = _rate(items)
        base = _rate([r.methods[reference] for r in subset]) if reference else 0.0
        ar_name = counterpart(name, "ar")  # speculation's own gain: one token per step, same weights
        ar = _rate([r.methods[ar_name] for r in subset]) if ar_name in methods else 0.0
        decode = _decode_rate(items)
        decode_base = _decode_rate([r.methods[reference] for r in subset]) if reference else None
        return {
            "tokens_per_second": rate,
            "speedup": rate / base if base else None,
            "decode_tokens_per_second": decode,
            "decode_speedup": decode / decode_base if decode and decode_base else None,
            "mean_accepted_tokens": _mat(items),
            "speedup_vs_ar": rate / ar if ar else None,
            "items": items,
        }

    report_methods = {}
    for name in methods:
        b = block(name, results)
        compare_tokens = not sampled and counterpart(name, "baseline") in methods
        identical = [r.identical_to_baseline(name) for r in results] if compare_tokens else []
        report_methods[name] = {
            "tokens_per_second": b["tokens_per_second"],
            "speedup": b["speedup"],
            # After the first token (the prefill excluded): the part drafting can speed up.
            "decode_tokens_per_second": b["decode_tokens_per_second"],
            "decode_speedup": b["decode_speedup"],
            "mean_accepted_tokens": b["mean_accepted_tokens"],
            "new_tokens": sum(m.new_tokens for m in b["items"]),
            "wall_seconds": sum(m.seconds for m in b["items"]),
            "identical_to_baseline": sum(1 for i in identical if i) if compare_tokens else None,
            "prompts": len(results),
            "distribution_check": _check(b["items"]),
            # Against `ar` (tr's own forward, one token per step): the gain of speculation alone.
            "speedup_vs_ar": b["speedup_vs_ar"],
            "step_split": _step_split(b["items"]),
            "tokens_per_step": _tokens_per_step(b["items"]),
            "drafted_tokens": _by_source(b["items"], "drafted"),
            # Each source's acceptance: its drafted_tokens over these.
            "verified_nodes": _by_source(b["items"], "verified"),
        }
    categories: dict[str, dict] = {}
    for category in dict.fromkeys(r.record.category for r in results):
        subset = [r for r in results if r.record.category == category]
        categories[category] = {}
        for name in methods:
            b = block(name, subset)
            categories[category][name] = {
                "speedup": b["speedup"],
                "mean_accepted_tokens": b["mean_accepted_tokens"],
                "tokens_per_second": b["tokens_per_second"],
                "speedup_vs_ar": b["speedup_vs_ar"],
            }
    prompts = []
    for r in results:
        entry: dict = {"id": r.record.id, "category": r.record.category, "turns": r.turns}
        for name, m in r.methods.items():
            entry[name] = {
                "new_tokens": m.new_tokens,
                "wall_seconds": m.seconds,
                "mean_accepted_tokens": m.mean_accepted_tokens,
                "identical_to_baseline": None if sampled else r.identical_to_baseline(name),
            }
        prompts.append(entry)
    return {
        "environment": {**environment, "speedup_over": reference},
        "methods": report_methods,
        "categories": categories,
        "prompts": prompts,
    }
