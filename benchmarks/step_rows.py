"""t(N) of the whole decoding step (layers, head, verification's top-k) for N = 1..32 per kernel
build (TR_KERNELS=avx2 / vnni / the widest, AMX where the CPU has it) and thread count, on a model
as `tr` loads it by default (auto weights: a GGUF runs on tr's int4/int8 kernels).

Each build in a process of its own; the sizes measured round-robin (calibration's own
`measure_cost`: N tokens over a 256-token cache, each size's median ratio to t(1) over --repeats), and
t(N)/t(1) printed beside. On a shared machine the single-thread figures are the trustworthy ones,
in thread CPU time (--cpu-time --threads 1) most of all.

    python benchmarks/step_rows.py [MODEL] [--builds avx2,vnni,amx] [--threads 1,2] [--repeats 7]
        [--weights auto|int4|int8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def child(model_arg: str | None, threads: list[int], repeats: int, cpu_time: bool, weights: str = "auto") -> dict:
    import torch

    from tr_cli.core import TokenRecyclingDecoder
    from tr_cli.models import load_model, native_kernels
    from tr_cli.models.resolve import resolve_model
    from tr_cli.models.runtime import Runtime
    from tr_cli.store.paths import cache_dir

    if cpu_time:  # this thread's CPU time: on a shared machine, time others' processes took is left out
        import time

        from tr_cli.core.design import cost_model

        cost_model.time = type("ThreadClock", (), {"perf_counter": staticmethod(time.thread_time)})
    runtime = Runtime.resolve("auto", "auto", weights, resolve_model(model_arg).stored_as)
    loaded = load_model(model_arg, runtime, cache=cache_dir())
    decoder = TokenRecyclingDecoder(loaded.model)
    out = {"model": loaded.model_id, "weights": loaded.runtime.weights.name, "build": native_kernels.instruction_set()}
    for count in threads:
        torch.set_num_threads(count)
        cost = decoder.measure_cost(sizes=SIZES, repeats=repeats)
        out[str(count)] = [cost.time(n) * 1000 for n in SIZES]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--builds", default="avx2,vnni,amx")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--weights", default="auto", help="tr's weights mode (auto: what `tr` picks; int4, int8...)")
    parser.add_argument("--cpu-time", action="store_true", help="time in this thread's CPU time (one thread only)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.child:
        print(json.dumps(child(args.model, threads, args.repeats, args.cpu_time, args.weights)))
        return
    for build in args.builds.split(","):
        env = {k: v for k, v in os.environ.items() if k != "TR_KERNELS"}
        if build != "amx":
            env["TR_KERNELS"] = build
        argv = [a for a in sys.argv[1:] if a != "--child"]
        done = subprocess.run([sys.executable, __file__, *argv, "--child"], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{build}: failed\n{done.stderr[-2000:]}")
            continue
        result = json.loads(done.stdout.splitlines()[-1])
        for count in threads:
            ms = result[str(count)]
            cells = " ".join(f"{n}:{t:.1f}" for n, t in zip(SIZES, ms, strict=True))
            ratio = ms[SIZES.index(8)] / ms[0]
            print(
                f"{result['model']} {result['weights']} {result['build']:<11} {count} thr  t(N) ms {cells}  "
                f"t(8)/t(1) {ratio:.2f}  t(32)/t(1) {ms[-1] / ms[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
