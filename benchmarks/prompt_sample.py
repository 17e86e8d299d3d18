"""The Spec-Bench sample the ablation scripts (tree_tuning.py, init_ablation.py) decode: a
round-robin over categories (MT-Bench as one), so every category is represented.

`tr bench --per-category N` is the benchmark's own selection; this one is kept so that the
ablations in results/ can be rerun on the same prompts.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parent / "prompts" / "spec_bench.jsonl"


def pick_prompts(path: Path, limit: int) -> list[dict]:
    """Round-robin over categories so every category is represented."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        group = "mt_bench" if row["question_id"] < 161 else row["category"]
        groups[group].append(row)
    picked, i = [], 0
    while len(picked) < limit:
        for group in groups.values():
            if i < len(group) and len(picked) < limit:
                picked.append(group[i * 7 % len(group)])
        i += 1
    return picked
