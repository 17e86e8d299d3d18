"""t(N) of tr's two forward paths (the model's own, the direct Llama-family one) per weights mode.

One process, the paths interleaved per measurement, N new tokens over a 300-token cache, the
step's top-k included (as calibration measures it). Also checks that both give the same logits.

    python benchmarks/forward_paths.py [MODEL] [--sizes 1,2,4,8,16,32] [--weights dense,int8,int4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tr_cli.core.attention import AttentionLayout, causal_visibility
from tr_cli.core.forward import LlamaFamilyForward, ModelForward
from tr_cli.core.kv_cache import CompactingCache
from tr_cli.models import Runtime, WeightsMode, load_model
from tr_cli.models.weights import quantized_copy
from tr_cli.store.paths import cache_dir

CONTEXT = 300


def _measure(paths: dict, model: torch.nn.Module, n: int, repeats: int) -> dict[str, float]:
    layout = AttentionLayout.from_config(model.config, torch.bfloat16, "cpu")
    ids = torch.randint(0, model.config.vocab_size, (CONTEXT + n,), generator=torch.Generator().manual_seed(0))
    caches = {}
    for name, forward in paths.items():
        cache = CompactingCache()
        positions = torch.arange(CONTEXT)
        forward(ids[:CONTEXT], positions, layout.build(0, positions, causal_visibility(CONTEXT, "cpu")), cache)
        caches[name] = cache
    positions = torch.arange(n) + CONTEXT
    mask = layout.build(CONTEXT, positions, causal_visibility(n, "cpu"))
    samples: dict[str, list[float]] = {name: [] for name in paths}
    logits = {}
    for _ in range(repeats + 3):  # the first 3 warm up
        for name, forward in paths.items():
            start = time.perf_counter()
            logits[name] = forward(ids[CONTEXT:], positions, mask, caches[name])
            torch.topk(logits[name], 8)
            samples[name].append(time.perf_counter() - start)
            caches[name].crop(CONTEXT)
    first, *others = logits.values()
    assert all(torch.equal(first, other) for other in others), "the paths' logits differ"
    return {name: statistics.median(values[3:]) * 1000 for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    parser.add_argument("--weights", default="dense,int8,int4")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    loaded = load_model(args.model, Runtime.resolve(dtype="bfloat16"), cache=cache_dir())
    rows = []
    print(f"{loaded.model_id}, bfloat16, {torch.get_num_threads()} threads; ms, median of {args.repeats}")
    with torch.inference_mode():
        for weights in args.weights.split(","):
            model = loaded.model if weights == "dense" else quantized_copy(loaded.model, WeightsMode.parse(weights))
            paths = {"model": ModelForward(model, "cache"), "direct": LlamaFamilyForward(model)}
            for n in (int(s) for s in args.sizes.split(",")):
                ms = _measure(paths, model, n, args.repeats)
                rows.append({"weights": weights, "n": n, **ms})
                print(f"{weights:>5} N={n:<3} model {ms['model']:6.1f}  direct {ms['direct']:6.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"model": loaded.model_id, "context": CONTEXT, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
