"""Fit the draft tree to this machine: t(N) calibration, acceptance by (depth, slot) measured with
a deep exploratory tree, the tree designed from them, and a side-by-side check of paper vs auto
(vs auto + lookup chain) on Spec-Bench prompts. Numbers go to benchmarks/results/.

    python benchmarks/tree_tuning.py --dtype bfloat16 --explore 12 --compare 12 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from tr_cli.core import PRESETS, StopCondition, TokenRecyclingDecoder
from tr_cli.core.design.acceptance_stats import AcceptanceStats
from tr_cli.core.design.tree_design import best_paths, design_tree
from tr_cli.core.drafters import DraftPlan
from tr_cli.core.tree import TreeSpec
from tr_cli.models import Runtime, load_model
from tr_cli.store.hot_matrix import HotMatrix
from tr_cli.store.paths import cache_dir
from tr_cli.text.conversation import encode_prompt

from prompt_sample import DATA, pick_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--explore", type=int, default=12, help="prompts decoded with the exploratory tree")
    parser.add_argument("--compare", type=int, default=12, help="prompts for the side-by-side comparison")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    loaded = load_model(None, Runtime.resolve("cpu", args.dtype), cache=cache_dir())
    model, tok = loaded.model, loaded.tokenizer
    hot = HotMatrix.open(tok, loaded.vocab_size, loaded.model_id, save=False)
    matrix = hot.matrix
    stop = StopCondition.build(args.max_new_tokens, loaded.eos_token_ids)
    prompts = pick_prompts(DATA, args.explore + args.compare)
    report: dict = {
        "model": loaded.model_id,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "matrix": hot.describe(),
        "max_new_tokens": args.max_new_tokens,
    }

    probe = TokenRecyclingDecoder(model, matrix=matrix.clone())
    cost = probe.measure_cost()
    report["t_ms"] = {n: round(s * 1e3, 2) for n, s in zip(cost.sizes, cost.seconds, strict=True)}
    print("t(N) ms:", report["t_ms"], flush=True)

    # Exploration: 128 nodes, best-first under a flat-ish prior so deep and late slots get tried.
    explore = TreeSpec.from_paths(
        "explore", [list(p) for _, p in best_paths([[0.5 / (1 + s) for s in range(8)] for _ in range(10)], 8, 128)]
    )
    stats = AcceptanceStats(8)
    decoder = TokenRecyclingDecoder(model, matrix=matrix, tree=explore, acceptance=stats)
    for row in prompts[: args.explore]:
        decoder.reset()
        decoder.generate(encode_prompt(tok, row["turns"][0]), stop)
    p = stats.probabilities()
    report["p_depth_slot"] = [[round(x, 4) for x in row] for row in p[:10]]
    report["trials_depth_slot"] = stats.to_dict()["trials"][:10]
    print("p(d,s):")
    for d, row in enumerate(p[:10]):
        print(f"  d{d + 1}: " + " ".join(f"{x:.3f}" for x in row))
    design = design_tree(p, cost, 8)
    report["auto_tree"] = {
        "name": design.spec.name,
        "widths": design.spec.widths(),
        "paths": design.spec.paths(),
        "expected_tokens": design.expected_tokens,
        "step_ms": design.step_seconds * 1e3,
    }
    print(
        f"designed: {design.spec.name} widths {design.spec.widths()} E[tokens] {design.expected_tokens:.2f} "
        f"t {design.step_seconds * 1e3:.1f} ms -> {design.tokens_per_second:.1f} tok/s (t(1) {1 / cost.seconds[0]:.1f})"
    )

    # Side by side, per prompt interleaved; each TR variant keeps its own copy of the matrix.
    def hf(ids: list[int], lookup: bool) -> tuple[list[int], float]:
        t = torch.tensor([ids])
        extra = {"prompt_lookup_num_tokens": 10} if lookup else {}
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                t,
                attention_mask=torch.ones_like(t),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=loaded.eos_token_ids[0],
                **extra,
            )
        return out[0, len(ids) :].tolist(), time.perf_counter() - start

    variants = {
        "paper": dict(tree=PRESETS["paper"]),
        "auto": dict(cost=cost),
        "auto+lookup": dict(
            cost=cost, drafters=DraftPlan.of(None, {"lookup": 10, "store": 0}).drafters(loaded.runtime.device)
        ),
        "paper+lookup": dict(
            tree=PRESETS["paper"],
            drafters=DraftPlan.of(PRESETS["paper"], {"lookup": 10}).drafters(loaded.runtime.device),
        ),
    }
    decoders = {}
    for name, kw in variants.items():
        s = AcceptanceStats(8)
        s.load_dict(stats.to_dict())
        decoders[name] = TokenRecyclingDecoder(model, matrix=matrix.clone(), acceptance=s, **kw)
    totals: dict = defaultdict(lambda: defaultdict(float))
    cats: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    hf(encode_prompt(tok, "Warm up."), False)
    for i, row in enumerate(prompts[args.explore : args.explore + args.compare]):
        ids = encode_prompt(tok, row["turns"][0])
        cat = row["category"]
        ref, base_s = hf(ids, False)
        line = [f"{i + 1:2d} {cat:14s} base {len(ref) / base_s:5.1f}"]
        runs = {"baseline": (ref, base_s, 0, 0, {})}
        out, s = hf(ids, True)
        runs["pld"] = (out, s, 0, 0, {})
        for name, dec in decoders.items():
            dec.reset()
            r = dec.generate(ids, stop)
            st = r.stats
            split = st.step_timings.seconds_by_phase()
            runs[name] = (r.tokens, st.wall_seconds, st.steps, st.step_tokens, split)
        for name, (out, s, steps, step_tokens, split) in runs.items():
            for b in (totals[name], cats[cat][name]):
                b["tokens"] += len(out)
                b["seconds"] += s
                b["steps"] += steps
                b["step_tokens"] += step_tokens
                b["identical"] += out == ref
                for ph, v in split.items():
                    b[ph] += v
            if name != "baseline":
                line.append(f"{name} {(len(out) / s) / (len(ref) / base_s):4.2f}x")
        print(" | ".join(line), flush=True)
    base = totals["baseline"]["tokens"] / totals["baseline"]["seconds"]
    report["baseline_tok_s"] = base
    report["methods"] = {}
    for name, t in totals.items():
        tps = t["tokens"] / t["seconds"]
        entry = {
            "tok_s": tps,
            "speedup": tps / base,
            "identical": int(t["identical"]),
            "by_category": {
                c: (cats[c][name]["tokens"] / cats[c][name]["seconds"])
                / (cats[c]["baseline"]["tokens"] / cats[c]["baseline"]["seconds"])
                for c in cats
            },
        }
        if t["steps"]:
            entry["mat"] = t["step_tokens"] / t["steps"]
            step = sum(t[ph] for ph in ("draft", "forward", "verify", "update"))
            entry["step_ms"] = {ph: t[ph] / t["steps"] * 1e3 for ph in ("draft", "forward", "verify", "update")}
            entry["outside_forward"] = 1 - t["forward"] / step
        if name in decoders and decoders[name].designed:
            entry["tree_at_end"] = decoders[name].tree.name
        report["methods"][name] = entry
        print(
            f"{name:13s} {tps:5.1f} tok/s {tps / base:4.2f}x MAT {entry.get('mat', 1):.2f} "
            f"identical {int(t['identical'])} outside-forward {entry.get('outside_forward', 0):.1%} "
            + " ".join(f"{c[:5]} {v:.2f}" for c, v in entry["by_category"].items())
        )
    if args.output:
        args.output.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
