"""Paper tree vs transformers greedy on Spec-Bench prompts: MAT, speedup, identical outputs and
the per-step time split. A stop-gap until `tr bench`; numbers go to benchmarks/results/.

    python benchmarks/core_speed.py --dtype bfloat16 --limit 20 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from tr_cli.core import StopCondition, TokenRecyclingDecoder, new_matrix
from tr_cli.models import load_model
from tr_cli.text import encode_prompt

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spec_bench.jsonl"


def pick_prompts(path: Path, limit: int) -> list[dict]:
    """Round-robin over categories so every category is represented."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        group = "mt_bench" if row["question_id"] < 161 else row["category"]
        groups[group].append(row)
    picked, i = [], 0
    while len(picked) < limit:
        for group in groups.values():
            if i < len(group) and len(picked) < limit:
                picked.append(group[i * 7 % len(group)])
        i += 1
    return picked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=Path, default=DATA)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    loaded = load_model(args.model, "cpu", args.dtype)
    model, tok = loaded.model, loaded.tokenizer
    prompts = pick_prompts(args.prompts, args.limit)
    variants = {"tr_seeded": True, "tr_unseeded": False}
    # One matrix per variant, carried across prompts (hot within the run, cold at its start).
    matrices = {name: new_matrix(model.get_output_embeddings().weight.shape[0]) for name in variants}
    stop = StopCondition.build(args.max_new_tokens, loaded.eos_token_ids)

    def baseline(ids: list[int]) -> tuple[list[int], float]:
        t = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, pad_token_id=loaded.eos_token_ids[0])
        return out[0, len(ids):].tolist(), time.perf_counter() - start

    warm = encode_prompt(tok, "Warm up.")
    baseline(warm)
    TokenRecyclingDecoder(model, matrix=new_matrix(matrices["tr_seeded"].shape[0])).generate(warm, stop)

    totals = defaultdict(lambda: defaultdict(float))
    per_category = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for i, row in enumerate(prompts):
        ids = encode_prompt(tok, row["turns"][0])
        ref, seconds = baseline(ids)
        cat = row["category"]
        for bucket in (totals["baseline"], per_category[cat]["baseline"]):
            bucket["tokens"] += len(ref)
            bucket["seconds"] += seconds
        line = [f"{i + 1:2d} {cat:14s} base {len(ref) / seconds:5.1f} tok/s"]
        for name, seed in variants.items():
            decoder = TokenRecyclingDecoder(model, matrix=matrices[name], seed_from_prompt=seed)
            result = decoder.generate(ids, stop)
            s = result.stats
            for bucket in (totals[name], per_category[cat][name]):
                bucket["tokens"] += s.new_tokens
                bucket["seconds"] += s.wall_seconds
                bucket["steps"] += s.steps
                bucket["step_tokens"] += s.step_tokens
                bucket["identical"] += result.tokens == ref
                for phase in ("draft", "forward", "verify", "update"):
                    bucket[phase] += getattr(s, f"{phase}_seconds")
            line.append(f"{name} {s.new_tokens / s.wall_seconds:5.1f} tok/s MAT {s.mean_accepted_tokens:.2f} {'=' if result.tokens == ref else '≠'}")
        print(" | ".join(line), flush=True)

    base_tps = totals["baseline"]["tokens"] / totals["baseline"]["seconds"]
    report = {"model": loaded.model_id, "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "baseline_tokens_per_second": base_tps, "methods": {}}
    print(f"\nbaseline (HF greedy) {base_tps:.2f} tok/s")
    for name in variants:
        t = totals[name]
        tps = t["tokens"] / t["seconds"]
        split = {p: t[p] / t["steps"] * 1e3 for p in ("draft", "forward", "verify", "update")}
        cats = {c: (per_category[c][name]["tokens"] / per_category[c][name]["seconds"]) /
                (per_category[c]["baseline"]["tokens"] / per_category[c]["baseline"]["seconds"]) for c in per_category}
        report["methods"][name] = {"tokens_per_second": tps, "speedup": tps / base_tps, "mat": t["step_tokens"] / t["steps"],
                                   "identical": int(t["identical"]), "step_ms": split, "speedup_by_category": cats}
        print(f"{name}: {tps:.2f} tok/s, speedup {tps / base_tps:.2f}x, MAT {t['step_tokens'] / t['steps']:.2f}, "
              f"identical {int(t['identical'])}/{len(prompts)}, per step ms " + " / ".join(f"{k} {v:.1f}" for k, v in split.items()))
        print("   by category: " + ", ".join(f"{c} {v:.2f}x" for c, v in cats.items()))
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
