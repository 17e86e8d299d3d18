"""On paper: the tree and the speed a machine with more cores would get, from what a run measured here.

A step over N tokens costs t(N) = t(1) + (t(N) - t(1)): one pass over the weights, bound by memory
bandwidth, plus the extra rows' multiply-adds, bound by compute. More cores of the same kind divide
the second part and leave the first (a desktop's memory is faster than a 2-core VM's share, so t(1)
kept as measured is the cautious side):

    t_C(N) = t(1) + (t(N) - t(1)) * threads / C

The tree designer (core/design/tree_design.py, as tr runs it) then picks the tree for t_C from the
run's own acceptance statistics (matrix nodes only: prompt lookup and the store add to both sides
alike), and the expected tokens a step over its time give tokens per second beside one-token steps.

    python benchmarks/core_projection.py TR_HOME [--cores 2 4 8 16]

TR_HOME: a home a `tr bench` or `tr generate` run left (its data/calibration/*.json t(N) and
data/matrices/*.accept.json statistics; the newest of each is used).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tr_cli.core.design.acceptance_stats import NEUTRAL_CONTEXT
from tr_cli.core.design.cost_model import CostModel
from tr_cli.core.design.tree_design import design_tree
from tr_cli.store.acceptance_file import read_acceptance


def projected(cost: CostModel, threads: int, cores: int) -> CostModel:
    """`cost` measured on `threads` threads, its extra rows' time divided among `cores`."""
    first = cost.seconds[0]
    return CostModel(cost.sizes, tuple(first + (s - first) * threads / cores for s in cost.seconds))


def newest(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"{folder}: no {pattern}; run tr bench or tr generate with TR_HOME set to this home first")
    return found[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("--cores", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()

    record = json.loads(newest(args.home / "data" / "calibration", "*.json").read_text())
    cost, threads = CostModel.from_dict(record), int(record["threads"])
    stats = read_acceptance(newest(args.home / "data" / "matrices", "*.accept.json"), args.k, "cpu")
    p = stats.probabilities(NEUTRAL_CONTEXT)
    print(f"model: {record.get('model')} · measured on {record.get('device')}, {threads} threads")
    measured = ", ".join(f"{n}: {s * 1e3:.1f}" for n, s in zip(cost.sizes, cost.seconds, strict=True))
    print(f"t(N) measured, ms: {measured}")
    print(f"p(depth 1, slot 0..3) = {', '.join(f'{x:.2f}' for x in p[0][:4])}; p(depth 2, slot 0) = {p[1][0]:.2f}")
    print()
    columns = ["cores", "t(1) ms", "t(8) ms", "t(8)/t(1)", "designed tree", "expected tokens a step", "step ms"]
    columns += ["tok/s one-token", "tok/s designed", "gain"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for cores in args.cores:
        model = projected(cost, threads, cores)
        design = design_tree(p, model, args.k)
        plain = 1 / model.time(1)
        rate = design.tokens_per_second
        print(
            f"| {cores} | {model.time(1) * 1e3:.1f} | {model.time(8) * 1e3:.1f} | {model.time(8) / model.time(1):.2f} "
            f"| {design.spec.name} | {design.expected_tokens:.2f} | {design.step_seconds * 1e3:.1f} "
            f"| {plain:.1f} | {rate:.1f} | {rate / plain:.2f}× |"
        )


if __name__ == "__main__":
    main()
