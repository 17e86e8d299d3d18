"""The paper's matrix-initialization ablation on our model: MAT and speedup for
(a) zeros per prompt, (b) prompt-seeded only, (c) hot: inherited from earlier prompts,
(d) `tr matrix init` from a corpus (other Spec-Bench prompts), then hot as well.

    python benchmarks/init_ablation.py --limit 30 --max-new-tokens 128 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tr_cli.core import StopCondition, TokenRecyclingDecoder, new_matrix
from tr_cli.core.decode import PrefillLearning
from tr_cli.core.matrix_init import fill_from_token_lists
from tr_cli.models import Runtime, load_model
from tr_cli.store.paths import cache_dir
from tr_cli.text.conversation import encode_prompt

from prompt_sample import DATA, pick_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--warm-prompts", type=int, default=30, help="earlier prompts that make (c) hot")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    loaded = load_model(None, Runtime.resolve("cpu", args.dtype), cache=cache_dir())
    model, tok = loaded.model, loaded.tokenizer
    vocab = loaded.vocab_size
    every = pick_prompts(DATA, args.limit + args.warm_prompts)
    measured, earlier = every[: args.limit], every[args.limit :]
    measured_ids = {row["question_id"] for row in measured}
    stop = StopCondition.build(args.max_new_tokens, loaded.eos_token_ids)

    # (c) inherits a matrix from decoding other prompts first, as a returning user would.
    hot = new_matrix(vocab)
    for row in earlier:
        TokenRecyclingDecoder(model, matrix=hot).generate(encode_prompt(tok, row["turns"][0]), stop)
    # (d) a matrix built by prefill over the rest of the Spec-Bench questions (not the measured ones).
    corpus = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    corpus_ids = [
        encode_prompt(tok, turn) for row in corpus if row["question_id"] not in measured_ids for turn in row["turns"]
    ]
    initialized = new_matrix(vocab)
    t0 = time.perf_counter()
    fill_from_token_lists(model, initialized, corpus_ids)
    print(f"matrix init over {sum(map(len, corpus_ids)):,} tokens took {time.perf_counter() - t0:.0f} s", flush=True)

    variants = {
        "a_zeros": lambda: (new_matrix(vocab), False),
        "b_prompt_seeded": lambda: (new_matrix(vocab), True),
        "c_hot_inherited": lambda: (hot, True),
        "d_matrix_init": lambda: (initialized, True),
    }
    totals = {name: {"tokens": 0, "seconds": 0.0, "steps": 0, "step_tokens": 0} for name in ["baseline", *variants]}
    for i, row in enumerate(measured):
        ids = encode_prompt(tok, row["turns"][0])
        prompt = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=loaded.eos_token_ids[0],
            )
        totals["baseline"]["seconds"] += time.perf_counter() - start
        totals["baseline"]["tokens"] += out.shape[1] - len(ids)
        line = [f"{i + 1:2d} {row['category']:14s}"]
        for name, make in variants.items():
            matrix, seed = make()
            learning = PrefillLearning.EVERY_ROW if seed else PrefillLearning.NONE
            s = TokenRecyclingDecoder(model, matrix=matrix, prefill_learning=learning).generate(ids, stop).stats
            t = totals[name]
            t["tokens"] += s.new_tokens
            t["seconds"] += s.wall_seconds
            t["steps"] += s.steps
            t["step_tokens"] += s.step_tokens
            line.append(f"{name} MAT {s.mean_accepted_tokens:.2f}")
        print(" | ".join(line), flush=True)

    base_tps = totals["baseline"]["tokens"] / totals["baseline"]["seconds"]
    report = {
        "model": loaded.model_id,
        "dtype": args.dtype,
        "prompts": len(measured),
        "max_new_tokens": args.max_new_tokens,
        "baseline_tokens_per_second": base_tps,
        "variants": {},
    }
    for name in variants:
        t = totals[name]
        tps = t["tokens"] / t["seconds"]
        report["variants"][name] = {
            "mat": t["step_tokens"] / t["steps"],
            "tokens_per_second": tps,
            "speedup": tps / base_tps,
        }
        print(f"{name:16s} MAT {t['step_tokens'] / t['steps']:.2f}  {tps:5.1f} tok/s  speedup {tps / base_tps:.2f}x")
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
