"""Attained int8 multiply-adds per second of tr's int4/int5/int8 matmuls for M = 1..32 rows, on every
matrix shape of three models, per kernel build (AVX2, AVX512-VNNI, AMX), on 1 and 2 threads,
beside this core's peak for each build's instruction mix (benchmarks/instruction_peak.c).

Shapes (outputs x inputs): fused q/k/v, o, fused gate/up, down, head of SmolLM2-135M, Qwen2.5-0.5B
and Qwen2-1.5B. Weights are random levels in the kernels' layout (models/weights.py), enough
copies of each matrix that a round streams >= 64 MB (--stream-mb), as a model's layers do (one copy
would sit in the cache; where the L3 holds 64 MB, as a 260 MiB Xeon's does, ask for more: a decoding
step streams from memory). Each figure is the fastest of --repeats rounds: other processes only ever
add time, and on a shared machine the single-thread figures (in thread CPU time) are the trustworthy
ones.

    python benchmarks/kernel_rows.py [--builds avx2,vnni,amx] [--rows 1,2,4,8,16,32] [--threads 1,2]
        [--models smollm2,qwen0.5b,qwen1.5b] [--kinds int4,int5,int8,int8-q5] [--stream-mb 64]
        [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {  # hidden, intermediate, heads, kv heads, head dim, vocabulary
    "smollm2": (576, 1536, 9, 3, 64, 49152),
    "qwen0.5b": (896, 4864, 14, 2, 64, 151936),
    "qwen1.5b": (1536, 8960, 12, 2, 128, 151936),
}
BUILDS = {"avx2": "AVX2", "vnni": "AVX512-VNNI", "amx": "AMX"}
# Which peak each build's dot products run against (instruction_peak.c's names; the AMX build from
# the rows where its tiles take over (the kernels' tile_from_rows): the tile shape at that many rows,
# capped at 16, the most a tile holds; below them it runs the VNNI code). The AVX2 build sums int4's and Q5_0's
# products in int16 (a vpmaddwd per group, not per product): their ceiling is the int16 mix.
# The VNNI build's pair tiles run vpdpbusd on 512-bit registers (twice the ymm rate on a Zen 5).
_PEAK_OF = {"AVX2": "avx2_maddubs", "AVX512-VNNI": "vnni_zmm"}
_AVX2_INT16_KINDS = {"int4", "int5", "int8-q5"}
_KINDS = ("int4", "int5", "int8", "int8-q5")  # int5: GGUF's Q5 types as stored (int8-q5: as int8 levels)
_LEVEL_BYTES = {"int4": 128, "int5": 160}  # a (block, group)'s bytes of levels; int8: 256


def shapes(model: str) -> dict[str, tuple[int, int]]:
    hidden, inter, heads, kv, dim, vocab = MODELS[model]
    return {
        "qkv": ((heads + 2 * kv) * dim, hidden),
        "o": (hidden, heads * dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "head": (vocab, hidden),
    }


def peaks() -> dict[str, float]:
    """instruction_peak.c's GMAC/s, one core."""
    source = Path(__file__).with_name("instruction_peak.c")
    with tempfile.TemporaryDirectory() as scratch:
        binary = Path(scratch) / "peak"
        subprocess.run([os.environ.get("CC", "cc"), "-O2", str(source), "-o", str(binary)], check=True)
        out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {name: float(value) for name, value in (line.split() for line in out.splitlines())}


def _operands(kind: str, outputs: int, inputs: int, copies: int):
    import torch

    blocks, groups = (outputs + 7) // 8, inputs // 32
    generator = torch.Generator().manual_seed(outputs + inputs)
    sets = []
    for _ in range(copies):
        steps = (torch.rand(blocks, groups, 8, generator=generator) * 0.01).half()
        if kind in _LEVEL_BYTES:
            shape = (blocks, groups, _LEVEL_BYTES[kind])
            levels = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
            minimums = (-torch.rand(blocks, groups, 8, generator=generator) * 0.08).half()
            sets.append((levels, steps, minimums))
        else:
            # int8 from Q8_0 (levels to +-127) or from Q5_0 (-16..15: the AVX2 build sums 8 products in int16)
            widest = 16 if kind == "int8-q5" else 127
            levels = torch.randint(-widest, widest, (blocks, groups, 256), generator=generator, dtype=torch.int8)
            sets.append((levels, steps))
    return sets


def measure(args: argparse.Namespace) -> list[dict]:
    """In the child process: this build's times."""
    import torch

    from tr_cli.models import native_kernels
    from tr_cli.models.load import kernels_dir
    from tr_cli.store.paths import cache_dir

    native_kernels.load(kernels_dir(cache_dir()))
    build = native_kernels.instruction_set()
    tiles = torch.ops.tr_kernels.tile_from_rows()
    results = []
    for model in args.models.split(","):
        for name, (outputs, inputs) in shapes(model).items():
            for kind in args.kinds.split(","):
                bytes_per = outputs * inputs * _LEVEL_BYTES.get(kind, 256) // 256
                copies = max(1, (args.stream_mb << 20) // bytes_per)
                sets = _operands(kind, outputs, inputs, copies)
                op = getattr(torch.ops.tr_kernels, f"{kind.split('-')[0]}_mm")
                for threads in (int(t) for t in args.threads.split(",")):
                    torch.set_num_threads(threads)
                    # One thread: its own CPU time (what other processes took is left out); more: wall time.
                    clock = time.thread_time if threads == 1 else time.perf_counter
                    for rows in (int(r) for r in args.rows.split(",")):
                        x = torch.randn(rows, inputs)
                        for operands in sets[:2]:
                            op(x, *operands)
                        best = float("inf")
                        for _ in range(args.repeats):
                            start = clock()
                            for operands in sets:
                                op(x, *operands)
                            best = min(best, (clock() - start) / copies)
                        macs = rows * outputs * inputs
                        results.append(
                            {
                                "build": build,
                                "tiles": tiles,
                                "model": model,
                                "matrix": name,
                                "shape": [outputs, inputs],
                                "kind": kind,
                                "threads": threads,
                                "rows": rows,
                                "ms": best * 1000,
                                "gmacs": macs / best / 1e9,
                            }
                        )
                        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def _peak_for(build: str, kind: str, rows: int, peak: dict[str, float], tiles: int) -> float:
    if build == "AMX" and 0 < tiles <= rows:
        return peak.get(f"amx_{min(16, 1 << (rows.bit_length() - 1))}x32x8", float("nan"))
    if build == "AVX2" and kind in _AVX2_INT16_KINDS:
        return peak["avx2_int16"]
    return peak[_PEAK_OF.get(build, "vnni_zmm")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", default="avx2,vnni,amx")
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--kinds", default=",".join(_KINDS))
    parser.add_argument("--stream-mb", type=int, default=64, help="MB of weights a round streams (copies)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.kinds.split(",")) - set(_KINDS)
    if unknown:
        parser.error(f"--kinds: {', '.join(sorted(unknown))} unknown; choose from {', '.join(_KINDS)}")
    if args.child:
        print(json.dumps(measure(args)))
        return
    peak = peaks()
    print("peak GMAC/s, one core:", ", ".join(f"{k} {v:.0f}" for k, v in peak.items()))
    results = []
    for build in args.builds.split(","):
        env = dict(os.environ)
        env.pop("TR_KERNELS", None)
        if build != "amx":
            env["TR_KERNELS"] = build
        argv = [a for a in sys.argv[1:] if a != "--child"]
        done = subprocess.run(
            [sys.executable, __file__, *argv, "--child"], env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            print(f"{build}: failed\n{done.stderr[-2000:]}")
            continue
        results += json.loads(done.stdout.splitlines()[-1])
    rows = [int(r) for r in args.rows.split(",")]
    print("GMAC/s attained (and % of the build's one-core peak for its instruction mix at that row count)")
    header = f"{'model':<9} {'matrix':<8} {'kind':<7} {'build':<12} {'thr':>3} " + " ".join(
        f"{f'M={r}':>12}" for r in rows
    )
    print(header)
    table: dict[tuple, dict[int, dict]] = {}
    for r in results:
        table.setdefault((r["model"], r["matrix"], r["kind"], r["build"], r["threads"]), {})[r["rows"]] = r
    for (model, matrix, kind, build, threads), by_rows in table.items():
        cells = []
        for n in rows:
            r = by_rows.get(n)
            if r is None:
                cells.append(f"{'-':>12}")
                continue
            share = 100 * r["gmacs"] / (_peak_for(build, kind, n, peak, r["tiles"]) * threads)
            cells.append(f"{r['gmacs']:>6.1f} ({share:>3.0f}%)")
        print(f"{model:<9} {matrix:<8} {kind:<7} {build:<12} {threads:>3} " + " ".join(cells))
    if args.json:
        args.json.write_text(json.dumps({"peak": peak, "results": results}, indent=1))


if __name__ == "__main__":
    main()
