"""Run `tr bench` on the Spec-Bench question set and on MBPP; write JSON + Markdown results.

    python benchmarks/spec_bench.py --dtype bfloat16 --max-new-tokens 256            # everything
    python benchmarks/spec_bench.py --dtype float32 --per-category 5 --datasets spec_bench

Results land in benchmarks/results/<dataset>-<dtype>[-<n>pc].{json,md}; the Markdown carries the
environment line (machine, versions, matrix state). A full run of both files takes hours on a
2-core CPU: --per-category takes the first N prompts of each category.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--datasets", default="spec_bench,mbpp")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--per-category", type=int)
    parser.add_argument("--methods", default="baseline,pld,tr")
    parser.add_argument("--model")
    args = parser.parse_args()

    from tr_cli.bench.report import to_markdown

    for name in args.datasets.split(","):
        source = args.data / f"{name}.jsonl"
        stem = f"{name}-{args.dtype}" + (f"-{args.per_category}pc" if args.per_category else "")
        out_json = HERE / "results" / f"{stem}.json"
        cmd = [
            sys.executable,
            "-m",
            "tr_cli",
            "bench",
            str(source),
            "--dtype",
            args.dtype,
            "--methods",
            args.methods,
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--format",
            "json",
            "--output",
            str(out_json),
        ]
        if args.per_category:
            cmd += ["--per-category", str(args.per_category)]
        if args.model:
            cmd += ["--model", args.model]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        report = json.loads(out_json.read_text())
        (HERE / "results" / f"{stem}.md").write_text(f"# {name} ({args.dtype})\n\n" + to_markdown(report))
        print(to_markdown(report), flush=True)


if __name__ == "__main__":
    main()
