"""What `--weights` costs in quality: perplexity and greedy agreement against dense.

For each weights mode (on the same bfloat16 model, quantized copies as `tr bench` makes them):
- perplexity of the prompts' own text (natural text none of the models wrote), in one forward: a
  prompt, so the `+bf16` modes compute it on their bfloat16 weights;
- greedy replies (transformers `generate` on that model) compared with the dense model's: how many
  are identical, and the mean share of tokens that match before the first difference.

    python benchmarks/weights_quality.py [MODEL] [--prompts benchmarks/prompts/own.jsonl] [--limit 30]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from tr_cli.bench.methods import HFGenerate
from tr_cli.models import Runtime, load_model
from tr_cli.models.runtime import QUANTIZED_MODES
from tr_cli.models.weights import quantized_copy
from tr_cli.store.paths import cache_dir
from tr_cli.text.conversation import ConversationEncoder

HERE = Path(__file__).resolve().parent


def _perplexity(model: torch.nn.Module, texts: list[list[int]]) -> float:
    nll, count = 0.0, 0
    for ids in texts:
        batch = torch.tensor([ids])
        logits = model(batch).logits[0, :-1].float()
        nll += float(torch.nn.functional.cross_entropy(logits, batch[0, 1:], reduction="sum"))
        count += len(ids) - 1
    return math.exp(nll / count)


def _reply(model: torch.nn.Module, ids: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    """Greedy `generate`, as `tr bench`'s baseline runs it."""
    return HFGenerate(model, eos, prompt_lookup=False).run(ids, max_new_tokens).tokens


def _agreement(a: list[int], b: list[int]) -> float:
    """Share of the longer reply matching before the first difference."""
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--prompts", type=Path, default=HERE / "prompts" / "own.jsonl")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    loaded = load_model(args.model, Runtime.resolve(dtype="bfloat16"), cache=cache_dir())
    records = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()][: args.limit]
    tokenizer = loaded.tokenizer
    texts = [tokenizer(r["turns"][0])["input_ids"] for r in records]
    encoder = ConversationEncoder(tokenizer)
    chats = [encoder.encode([{"role": "user", "content": r["turns"][0]}]).ids for r in records]
    models = {"dense": loaded.model} | {m.name: quantized_copy(loaded.model, m) for m in QUANTIZED_MODES}
    results: dict[str, dict] = {}
    dense_replies: list[list[int]] = []
    with torch.inference_mode():
        for name, model in models.items():
            replies = [_reply(model, ids, args.max_new_tokens, loaded.eos_token_ids) for ids in chats]
            if name == "dense":
                dense_replies = replies
            agreement = [_agreement(r, d) for r, d in zip(replies, dense_replies, strict=True)]
            results[name] = {
                "perplexity": _perplexity(model, texts),
                "identical_replies": sum(r == d for r, d in zip(replies, dense_replies, strict=True)),
                "mean_agreement": sum(agreement) / len(agreement),
            }
            r = results[name]
            print(
                f"{name:>9}: perplexity {r['perplexity']:.2f} · replies identical to dense "
                f"{r['identical_replies']}/{len(chats)} · tokens matching before the first difference "
                f"{100 * r['mean_agreement']:.0f} %",
                flush=True,
            )
    if args.json:
        setup = {"model": loaded.model_id, "prompts": str(args.prompts), "max_new_tokens": args.max_new_tokens}
        args.json.write_text(json.dumps({**setup, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
