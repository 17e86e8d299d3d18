"""Plain llama.cpp (through llama-cpp-python) on a GGUF, greedy, the prompts `tr bench` runs.

The reference a CPU user already has (issue 16). Run it from a scratch virtual environment with
llama-cpp-python built from its sdist, never beside another heavy process:

    python -m venv /tmp/llamavenv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
        -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
        -DGGML_AMX_BF16=OFF" /tmp/llamavenv/bin/pip install --no-binary :all: llama-cpp-python
    /tmp/llamavenv/bin/python benchmarks/llama_cpp_bench.py MODEL.gguf benchmarks/prompts/own.jsonl

(GGML_NATIVE=OFF with the CPU's own instruction sets: a native build has died with SIGILL on
these virtual machines.) The prompts are the ones `tr bench PROMPTS --limit N --turns 1` counts
(the first one also warms up first). Each prompt's first turn goes through the GGUF's chat
template; the time counts prompt processing and generation, as `tr bench` counts prefill and
decoding. Prints one line per prompt and the total tokens/s; --json writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _prompts(path: Path, limit: int | None) -> list[tuple[str, str]]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["question_id"], r["turns"][0]) for r in (records[:limit] if limit else records)]


def main() -> None:
    from llama_cpp import Llama

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("prompts", type=Path)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--warmup", type=int, default=1, help="first prompts also run once first (32 tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    llm = Llama(str(args.gguf), n_ctx=4096, n_threads=args.threads, n_batch=512, verbose=False, seed=0)
    prompts = _prompts(args.prompts, args.limit)

    def reply(text: str, max_tokens: int) -> tuple[int, float]:
        llm.reset()
        start = time.perf_counter()
        out = llm.create_chat_completion(
            messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0.0, top_k=1
        )
        return out["usage"]["completion_tokens"], time.perf_counter() - start

    for _, text in prompts[: args.warmup]:
        reply(text, min(args.max_new_tokens, 32))
    rows = []
    for qid, text in prompts:
        tokens, seconds = reply(text, args.max_new_tokens)
        rows.append({"id": qid, "new_tokens": tokens, "wall_seconds": seconds})
        print(f"{qid}: {tokens} tokens in {seconds:.2f}s = {tokens / seconds:.1f} tok/s", flush=True)
    total_tokens = sum(r["new_tokens"] for r in rows)
    total_seconds = sum(r["wall_seconds"] for r in rows)
    print(f"llama.cpp: {total_tokens} tokens in {total_seconds:.1f}s = {total_tokens / total_seconds:.1f} tok/s")
    if args.json:
        summary = {"gguf": str(args.gguf), "threads": args.threads, "max_new_tokens": args.max_new_tokens}
        args.json.write_text(json.dumps({**summary, "prompts": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
