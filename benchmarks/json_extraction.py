"""The JSON-extraction workload: each prompt asks for fields out of a paragraph and carries the
JSON schema its reply must match (benchmarks/prompts/json_extraction.jsonl, 20 prompts written for
this benchmark). Two `tr bench` runs on the same prompts, each in a fresh TR_HOME (the starter
state):

1. constrained: every method decodes under the schema's grammar (transformers `generate` with the
   same grammar as a logits processor, `ar` and `tr` with it inside the decoder);
2. free: the same prompts without their schemas.

It prints both tables and the comparison the structured-output issue asks for: `tr`'s speedup over
constrained `generate` against its speedup over free `generate` on the same prompts — over the
whole wall time, and after the first token (a constrained reply is shorter than its prompt, so the
prefill every method pays alike weighs more in its wall time) — and the share of tokens the
grammar's drafts gave.

    python benchmarks/json_extraction.py --out benchmarks/results --tag avx2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = Path(__file__).parent / "prompts" / "json_extraction.jsonl"


def run_bench(prompts: Path, report: Path, home: Path, max_new_tokens: int, methods: str) -> dict:
    command = [sys.executable, "-m", "tr_cli", "bench", str(prompts), "--methods", methods]
    command += ["--max-new-tokens", str(max_new_tokens), "--format", "json", "-o", str(report)]
    subprocess.run(command, check=True, env={**os.environ, "TR_HOME": str(home)})
    return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()), help="where the two reports go")
    parser.add_argument("--tag", default="run", help="the reports' name part, e.g. the CPU kind")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--methods", default="baseline,ar,tr")
    parser.add_argument("--prompts", type=Path, default=PROMPTS, help="records with a schema each")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        free_prompts = scratch / "free.jsonl"
        with free_prompts.open("w") as out:
            for line in args.prompts.read_text().splitlines():
                record = json.loads(line)
                record.pop("schema")
                out.write(json.dumps(record) + "\n")
        reports = {}
        for name, prompts in (("schema", args.prompts), ("free", free_prompts)):
            report = args.out / f"json-extraction-{args.tag}-{name}.json"
            reports[name] = run_bench(prompts, report, scratch / f"home-{name}", args.max_new_tokens, args.methods)
            subprocess.run([sys.executable, "-m", "tr_cli", "bench", "--from-report", str(report), "--format", "md"])
    constrained, free = reports["schema"]["methods"]["tr"], reports["free"]["methods"]["tr"]
    drafted = constrained.get("drafted_tokens") or {}
    for label, key in (("wall time", "speedup"), ("after the first token", "decode_speedup")):
        if constrained.get(key) and free.get(key):
            print(f"tr over generate, {label}: constrained {constrained[key]:.2f}x, free {free[key]:.2f}x")
            print(f"  ratio (constrained / free speedup): {constrained[key] / free[key]:.2f}")
    print(f"tokens from the grammar drafts: {drafted.get('grammar', 0)} of {constrained['new_tokens']}")


if __name__ == "__main__":
    main()
