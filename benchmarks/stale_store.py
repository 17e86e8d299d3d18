"""A stale recycled store must not slow `tr` down: the guard, measured.

The store is filled with text unrelated to the prompts (Python's standard library source, for
prose prompts), so its lookups find common n-grams and propose continuations that are mostly
wrong. Four decoders run interleaved per prompt in one process, each on its own matrix copy:

- ar: one token per forward (tr's own forward, no drafts);
- store forced: the stale store's drafts verified whenever it has a match (no pricing), no tree;
- tr (priced): the default planner with the same stale store, lookup and matrix tree;
- tr (no store): the default planner without a store.

Usage: python benchmarks/stale_store.py [PROMPTS.jsonl] [--limit N] [--max-new-tokens N] [--out results/x.md]
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import time
from pathlib import Path

import torch

from tr_cli.core import PRESETS, StopCondition, TokenRecyclingDecoder
from tr_cli.core.drafters import DraftPlan, StoreLookupDrafter
from tr_cli.core.recycled_store import RecycledStore
from tr_cli.engine.calibration import load_or_calibrate
from tr_cli.models import Runtime, load_model
from tr_cli.store.paths import cache_dir
from tr_cli.text.conversation import ConversationEncoder, messages_of
from tr_cli.text.prompts import load_prompts

HERE = Path(__file__).resolve().parent


def stale_store(tokenizer, vocab_size: int, tokens: int) -> RecycledStore:
    """The standard library's source, file by file, until `tokens` tokens."""
    store = RecycledStore(vocab_size)
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        ids = tokenizer(path.read_text(errors="replace"), add_special_tokens=False)["input_ids"]
        store.add(ids[:20_000], stamp=len(store.documents))
        if store.total_tokens >= tokens:
            break
    return store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("prompts", nargs="?", default=str(HERE / "prompts" / "own.jsonl"))
    parser.add_argument("--categories", default="writing,explain,chat")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--store-tokens", type=int, default=300_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    loaded = load_model(None, Runtime.resolve(), cache=cache_dir())
    encoder = ConversationEncoder(loaded.tokenizer)
    wanted = set(args.categories.split(","))
    records = [r for r in load_prompts(Path(args.prompts)) if r.category in wanted][: args.limit]
    store = stale_store(loaded.tokenizer, loaded.vocab_size, args.store_tokens)
    store.added.clear()

    def cost(decoder):
        return load_or_calibrate(decoder, loaded.model_id)

    model, eos = loaded.model, loaded.eos_token_ids
    decoders = {
        "ar": TokenRecyclingDecoder(model, tree=PRESETS["none"]),
        "store forced": TokenRecyclingDecoder(model, tree=PRESETS["none"], drafters=[StoreLookupDrafter(store.copy())]),
        "tr (priced, stale store)": TokenRecyclingDecoder(
            model, cost=cost, drafters=DraftPlan.of().drafters("cpu", store.copy())
        ),
        "tr (no store)": TokenRecyclingDecoder(
            model, cost=cost, drafters=DraftPlan.of(None, {"store": 0}).drafters("cpu")
        ),
    }
    totals = {name: [0, 0.0, 0] for name in decoders}  # tokens, seconds, steps
    for record in records:
        ids = encoder.encode(messages_of([], record.turns[0], None)).ids
        for name, decoder in decoders.items():
            decoder.reset()
            result = decoder.generate(ids, StopCondition.build(args.max_new_tokens, eos))
            totals[name][0] += len(result.tokens)
            totals[name][1] += result.stats.wall_seconds
            totals[name][2] += result.stats.steps
        print(record.id, {n: round(t[0] / t[1], 2) for n, t in totals.items()}, file=sys.stderr)
    ar_rate = totals["ar"][0] / totals["ar"][1]
    lines = [
        f"# Stale store guard: {len(records)} own prompts ({args.categories}), first turn, "
        f"{args.max_new_tokens} tokens, {loaded.runtime.dtype_name}, store of {store.total_tokens:,} tokens of "
        "Python stdlib source (unrelated), matrices cold",
        "",
        "| decoder | tok/s | vs ar | MAT |",
        "|---|---|---|---|",
    ]
    for name, (tokens, seconds, steps) in totals.items():
        rate = tokens / seconds
        lines.append(f"| {name} | {rate:.2f} | {rate / ar_rate:.2f}× | {(tokens - len(records)) / steps:.2f} |")
    store_source = decoders["tr (priced, stale store)"].drafters[2]
    lines += ["", f"store source hit rate (priced run): {store_source.stats.hit_rate()}", ""]
    lines.append(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d')}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
