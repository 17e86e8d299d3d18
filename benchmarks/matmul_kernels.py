"""Time one decoder layer's weight matmuls per kernel and token count N, on this CPU.

The candidates for the forward underneath Token Recycling: float32 and bfloat16 dense `F.linear`,
weight-only int8 (`aten._weight_int8pack_mm`) with float32 or bfloat16 activations, and the layers
`--weights int4/int8` run (models/weights.py): torch's kernels (bfloat16 activations) and tr's own
(float32 activations, models/quantized_matmul.cpp; the lm_head of an int4 model is int8 in both).
Shapes default to SmolLM2-135M's (hidden 576, 9 query heads / 3 KV heads of 64, MLP 1536, 30
layers, vocabulary 49152). Prints per-layer and per-model (layers + lm_head) times.

    python benchmarks/matmul_kernels.py [--sizes 1,4,16,32,81] [--repeats 30] [--kernels "int4 tr,int4 torch"]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def _shapes(hidden: int, heads: int, kv_heads: int, head_dim: int, mlp: int) -> list[tuple[int, int]]:
    """(out, in) of every weight matrix of one Llama-style layer."""
    return [
        (heads * head_dim, hidden),
        (kv_heads * head_dim, hidden),
        (kv_heads * head_dim, hidden),
        (hidden, heads * head_dim),
        (mlp, hidden),
        (mlp, hidden),
        (hidden, mlp),
    ]


def median_ms(fn, repeats: int = 15) -> float:
    """Median wall time of `fn` in ms, after 3 warm-up calls (also used by step_capture.py)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def _int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
    return (weight / scales[:, None]).round().clamp(-128, 127).to(torch.int8), scales


def _layers(kind, weights: list[torch.Tensor]) -> list:
    """tr's quantized layers of `kind` over `weights`, as their kernel calls."""
    return [kind.quantized(w, None)._matmul for w in weights]


def _kernels(weights: list[torch.Tensor], head: bool = False) -> dict:
    """name -> (activation dtype, list of callables x -> y, one per weight); `head`: the output
    head's, which an int4 model keeps int8."""
    from tr_cli.models.weights import Int4Linear, Int8Linear, Q4Linear, Q8Linear

    fp32 = [lambda x, w=w: F.linear(x, w) for w in weights]
    bf = [w.to(torch.bfloat16) for w in weights]
    bf16 = [lambda x, w=w: F.linear(x, w) for w in bf]
    packed = [_int8(w) for w in weights]
    int8 = [lambda x, q=q, s=s: torch.ops.aten._weight_int8pack_mm(x, q, s.to(x.dtype)) for q, s in packed]
    return {
        "float32": (torch.float32, fp32),
        "bfloat16": (torch.bfloat16, bf16),
        "int8 w / fp32 act": (torch.float32, int8),
        "int8 w / bf16 act": (torch.bfloat16, int8),
        "int4 torch": (torch.bfloat16, _layers(Int8Linear if head else Int4Linear, weights)),
        "int4 tr": (torch.float32, _layers(Q8Linear if head else Q4Linear, weights)),
        "int8 torch": (torch.bfloat16, _layers(Int8Linear, weights)),
        "int8 tr": (torch.float32, _layers(Q8Linear, weights)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,8,16,32,48,81")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--mlp", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--kernels", default="", help="comma-separated names to run (default: all)")
    args = parser.parse_args()
    from tr_cli.models import native_kernels
    from tr_cli.models.load import kernels_dir
    from tr_cli.store.paths import cache_dir

    native_kernels.load(kernels_dir(cache_dir()), print)
    torch.manual_seed(0)
    shapes = _shapes(args.hidden, args.heads, args.kv_heads, args.head_dim, args.mlp)
    # Every layer its own weights, as in a model: one layer's would stay in the CPU cache.
    layers = [_kernels([torch.randn(o, i) * 0.02 for o, i in shapes]) for _ in range(args.layers)]
    head_kernels = _kernels([torch.randn(args.vocab, args.hidden) * 0.02], head=True)
    chosen = [name.strip() for name in args.kernels.split(",") if name.strip()] or list(head_kernels)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms, median of {args.repeats}")
    print(f"{'kernel':<20} {'N':>4} {'layers':>8} {'lm_head':>8} {'model':>8}")
    for name, (dtype, head_fns) in head_kernels.items():
        if name not in chosen:
            continue
        fns = [fn for layer in layers for fn in layer[name][1]]
        for n in (int(s) for s in args.sizes.split(",")):
            xs = [torch.randn(n, i, dtype=dtype) for _, i in shapes] * args.layers
            layers_ms = median_ms(lambda: [fn(x) for fn, x in zip(fns, xs, strict=True)], args.repeats)  # noqa: B023
            x = torch.randn(n, args.hidden, dtype=dtype)
            head_ms = median_ms(lambda: head_fns[0](x), args.repeats)  # noqa: B023
            print(f"{name:<20} {n:>4} {layers_ms:>8.2f} {head_ms:>8.2f} {layers_ms + head_ms:>8.1f}")


if __name__ == "__main__":
    main()
