"""How `tr` and transformers' own greedy `generate` hold up while another heavy process shares the
CPU, under a few OpenMP thread settings.

    python benchmarks/contention_bench.py                       # packaged SmolLM2, float32, 3 prompts
    python benchmarks/contention_bench.py --limit 4 -n 64 --json benchmarks/results/contention.json

Why: on this 2-core machine a forward that takes ~90 ms alone took ~3 s with a second torch process
running: two OpenMP teams that spin-wait for work take turns holding the cores. The question is
whether a thread setting gives a robust speed without costing the quiet case.

What it does: for each setting (environment variables given to the child, read by torch's OpenMP
runtime at start) and each competitor, one `tr bench --methods baseline,tr` child runs the same
prompts (first turns of the bundled sample, `--limit`), with the competitor started just before it
and stopped after it. Competitors:

  none     the quiet case;
  torch    another torch process doing 512x512 float32 matmuls in a loop with its default threads
           (what a second `tr`, a training job or a notebook would do);
  spin     one busy-loop process per core (not OpenMP: a compiler, a browser tab).

Each child gets a fresh TR_HOME whose `cache` links to the caller's tr cache (no GGUF conversion)
and whose calibration cache is measured once per setting on a quiet machine before the contended
runs, so the designed tree is the same in every run of one setting. Matrix state: the starter
matrix shipped with tr (seeded), `--no-save`, so every run starts from the same state.

Reported per run: baseline (transformers greedy generate) and tr tokens/s, tr's speedup and MAT.
Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
}
TORCH_COMPETITOR = """
import torch
a = torch.randn(512, 512)
while True:
    a = torch.tanh(a @ a)
"""
SPIN_COMPETITOR = "while True: pass"


def _competitors(kind: str) -> list[subprocess.Popen]:
    if kind == "none":
        return []
    if kind == "torch":
        return [subprocess.Popen([sys.executable, "-c", TORCH_COMPETITOR])]
    return [subprocess.Popen([sys.executable, "-c", SPIN_COMPETITOR]) for _ in range(os.cpu_count() or 2)]


def _home(root: Path, setting: str) -> Path:
    home = root / setting.replace(" ", "-")
    if not home.exists():
        (home / "cache").mkdir(parents=True)
        real_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tr" / "gguf"
        (home / "cache" / "gguf").symlink_to(real_cache)
    return home


def _bench(home: Path, env_extra: dict, args: argparse.Namespace) -> dict:
    tr = Path(sys.executable).parent / "tr"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TR_HOME": str(home), **env_extra}
    command = [str(tr), "bench", "--methods", "baseline,tr", "--limit", str(args.limit), "-n", str(args.n)]
    command += ["--dtype", args.dtype, "--turns", "1", "--warmup", "1", "--no-save", "--format", "json"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"tr bench failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--competitors", default="none,torch,spin")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tr-contention-"))
    rows = []
    try:
        for setting in args.settings.split(","):
            home = _home(root, setting)
            for competitor in args.competitors.split(","):
                processes = _competitors(competitor)
                try:
                    time.sleep(1.0 if processes else 0.0)  # let the competitor reach its loop
                    started = time.perf_counter()
                    report = _bench(home, SETTINGS[setting], args)
                finally:
                    for process in processes:
                        process.kill()
                        process.wait()
                methods = report["methods"]
                row = {
                    "setting": setting,
                    "competitor": competitor,
                    "baseline_tok_s": methods["baseline"]["tokens_per_second"],
                    "tr_tok_s": methods["tr"]["tokens_per_second"],
                    "speedup": methods["tr"].get("speedup"),
                    "mat": methods["tr"].get("mean_accepted_tokens"),
                    "tree": report["environment"].get("tree"),
                    "threads": report["environment"].get("threads"),
                    "wall_s": round(time.perf_counter() - started, 1),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    header = f"{'setting':10} {'competitor':10} {'baseline tok/s':>15} {'tr tok/s':>9} {'speedup':>8} {'MAT':>5}  tree"
    print(header)
    for r in rows:
        print(
            f"{r['setting']:10} {r['competitor']:10} {r['baseline_tok_s']:15.1f} {r['tr_tok_s']:9.1f} "
            f"{(r['speedup'] or 0):8.2f} {(r['mat'] or 0):5.2f}  {r['tree']}"
        )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
