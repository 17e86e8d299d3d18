"""Does tr rotate a GGUF with rope scaling as llama.cpp does? Tiny float32 models (tests/tiny_gguf.py)
with each scaling llama.cpp's converter writes (linear, YaRN, Gemma 3's global-only linear with a
sliding base, LongRoPE), greedy from the same 60 prompt tokens in tr's reading (the model tr loads,
transformers' forward) and in `llama-server` on the same file; beside it tr on the same weights
without the scaling metadata, which shows the check can tell. Random tiny models have flat
distributions, so a run can part at a near tie: the top-2 probability margin there is printed.

    TR_LLAMA_SERVER=.../llama-server python benchmarks/rope_against_llama_cpp.py [case ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny GGUF writer
from tiny_gguf import write_tiny_gguf  # noqa: E402

from tr_cli.models import Runtime, load_model  # noqa: E402

from tiny_models import COMMON, random_prompt, randomized  # noqa: E402

PROMPT, NEW, PORT = 60, 40, 8093
# What llama.cpp's ignore_eos bans: the tiny vocabulary's EOS and "<|endoftext|>".
BANNED = [3, COMMON["vocab_size"] - 1]


def _init(model: torch.nn.Module, embed: float = 0.1, std: float = 0.1) -> torch.nn.Module:
    torch.manual_seed(0)
    return randomized(model, embed, std)


def cases() -> Iterator[tuple[str, torch.nn.Module, dict, dict]]:
    """(name, model, metadata as the converter writes it, extra tensors)."""
    common = {k: v for k, v in COMMON.items() if k != "max_position_embeddings"}
    plain = dict(num_hidden_layers=2, max_position_embeddings=1024, **common)
    yield "plain", _init(LlamaForCausalLM(LlamaConfig(**plain))), {}, {}
    linear = {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}
    yield "linear", _init(LlamaForCausalLM(LlamaConfig(**plain))), linear, {}
    yarn = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32}
    yield "yarn", _init(Qwen2ForCausalLM(Qwen2Config(**plain))), yarn, {}
    # An attention factor (llama.cpp multiplies YaRN's magnitude by it) and a beta it ignores for qwen2.
    yarn_more = {**yarn, "rope.scaling.attn_factor": 1.3, "rope.scaling.yarn_beta_fast": 1.5}
    yield "yarn-attn", _init(Qwen2ForCausalLM(Qwen2Config(**plain))), yarn_more, {}
    # Gemma 3's real head dim (llama.cpp scales queries by 1/sqrt(head dim), transformers by its
    # query_pre_attn_scalar, 256 when a GGUF is read); a window past the sequence.
    gemma = Gemma3TextConfig(
        num_hidden_layers=6, head_dim=256, sliding_window=512, max_position_embeddings=1024, **common
    )
    scaled = {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0, "rope.freq_base_swa": 5000.0}
    yield "gemma3", _init(Gemma3ForCausalLM(gemma), 0.01, 0.2), {**scaled, "attention.value_length": 256}, {}
    pairs = 6  # a partial rotary of 0.75 over 16 dims
    factors = {
        "rope_factors_short.weight": np.array([1.0 + 0.25 * i for i in range(pairs)], np.float32),
        "rope_factors_long.weight": np.array([2.0 + 3.0 * i for i in range(pairs)], np.float32),
    }
    phi = Phi3Config(
        num_hidden_layers=2,
        max_position_embeddings=16384,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        **{**common, "vocab_size": 32064},
    )
    longrope = {
        "rope.scaling.type": "longrope",
        "rope.scaling.original_context_length": 4096,
        "rope.scaling.attn_factor": 1.25,
        "rope.dimension_count": 12,
    }
    yield "longrope", _init(Phi3ForCausalLM(phi)), longrope, factors


def llama_cpp(server: str, path: Path, ids: list[int]) -> list[int]:
    """llama-server's greedy tokens after `ids` (-c 512: LongRoPE's short factors)."""
    with open(path.with_suffix(".server.log"), "w") as log:
        proc = subprocess.Popen(
            [server, "-m", str(path), "-c", "512", "-t", "2", "--port", str(PORT), "-np", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            for _ in range(300):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1) as reply:
                        if json.load(reply).get("status") == "ok":
                            break
                except OSError:
                    time.sleep(0.2)
            body = {"prompt": ids, "n_predict": NEW, "temperature": 0, "top_k": 1, "ignore_eos": True}
            body |= {"cache_prompt": False, "return_tokens": True}
            request = urllib.request.Request(
                f"http://127.0.0.1:{PORT}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as reply:
                return json.load(reply)["tokens"]
        finally:
            proc.terminate()
            proc.wait()


def tr_reading(path: Path, ids: list[int], cache: Path) -> tuple[list[int], list[float]]:
    """Greedy tokens of the model tr loads from `path` (llama.cpp's banned tokens left out) and the
    top-2 probability margin at each step."""
    model = load_model(str(path), Runtime.resolve("cpu", "float32", "dense"), cache=cache).model
    sequence, tokens, margins = list(ids), [], []
    with torch.inference_mode():
        for _ in range(NEW):
            probs = torch.softmax(model(input_ids=torch.tensor([sequence])).logits[0, -1].float(), -1)
            probs[BANNED] = -1.0
            top = probs.topk(2)
            margins.append(float(top.values[0] - top.values[1]))
            tokens.append(int(top.indices[0]))
            sequence.append(tokens[-1])
    return tokens, margins


def agreed(theirs: list[int], ours: list[int]) -> int:
    """How many tokens the two greedy runs share before they part."""
    return next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a != b), len(ours))


def main() -> None:
    server = os.environ.get("TR_LLAMA_SERVER", "llama-server")
    wanted = set(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="rope-vs-llama-") as tmp:
        root = Path(tmp)
        for name, model, metadata, extra in cases():
            if wanted and name not in wanted:
                continue
            path = write_tiny_gguf(root / f"{name}.gguf", model, lambda *_: T.F32, metadata=metadata, extra=extra)
            kept = {k: v for k, v in metadata.items() if k in ("rope.dimension_count", "attention.value_length")}
            bare = write_tiny_gguf(root / f"{name}-bare.gguf", model, lambda *_: T.F32, metadata=kept)
            ids = random_prompt(PROMPT, 7)
            theirs = llama_cpp(server, path, ids)
            ours, margins = tr_reading(path, ids, root / "cache")
            without, _ = tr_reading(bare, ids, root / "cache")

            same, bare_same = agreed(theirs, ours), agreed(theirs, without)
            tie = f" (parting where tr's top-2 margin is {margins[same]:.1e})" if same < NEW else ""
            print(f"{name:10s} tr = llama.cpp for {same}/{NEW} tokens{tie}; without the scaling: {bare_same}/{NEW}")


if __name__ == "__main__":
    main()
