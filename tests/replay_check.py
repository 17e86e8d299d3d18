"""Run in a subprocess by test_weights_cache.py (a crashing kernel would take pytest down): for each
weights mode named on the command line, quantize the tiny Llama into a weights cache, move the
file's tensors by 0 and by 8 bytes (safetensors aligns them to 8 only), replay it into a fresh
model and compare several-row forwards with a model quantized afresh. Prints `ok MODE SHIFT` per
case, or `differs MODE SHIFT`."""

import struct
import sys
from pathlib import Path

import torch

from tr_cli.core.step_scope import decoding_step
from tr_cli.models import WeightsMode, native_kernels
from tr_cli.models.weights import quantize
from tr_cli.models.weights_cache import remembered

from tiny_models import random_prompt, tiny_model


def shifted(path: Path, by: int) -> None:
    """The same file with every tensor `by` bytes further in (spaces after the JSON header)."""
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(struct.pack("<Q", size + by) + data[8 : 8 + size] + b" " * by + data[8 + size :])


def model(dtype: torch.dtype) -> torch.nn.Module:
    return tiny_model("llama").to(dtype)


def main(directory: Path, modes: list[str]) -> None:
    ids = torch.tensor([random_prompt(12, seed=3)])
    for spec in modes:
        mode_name, dtype_name = spec.split("@")
        mode, dtype = WeightsMode.parse(mode_name), getattr(torch, dtype_name)
        if dtype == torch.float32:
            native_kernels.load(Path(sys.argv[2]))
        fresh = model(dtype)
        quantize(fresh, mode)
        for by in (0, 8):
            path = directory / f"{mode_name}-{dtype_name}-{by}.safetensors"
            with remembered(path):
                quantize(model(dtype), mode)
            shifted(path, by)
            later = model(dtype)
            with remembered(path) as memory:
                quantize(later, mode)
            replayed = memory.replaying and len(memory.calls) == len(memory.stored) > 0
            with torch.inference_mode(), decoding_step():  # the quantized kernels on every row
                same = torch.equal(later(ids).logits, fresh(ids).logits)
            with torch.inference_mode():  # a prompt's rows (the bfloat16 weights in a +bf16 mode)
                same = same and torch.equal(later(ids).logits, fresh(ids).logits)
            print(f"{'ok' if same and replayed else 'differs'} {spec} {by}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[3:])
