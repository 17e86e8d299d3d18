"""A GGUF of a real model's shape and quantization mix with random weights, for start-up and memory
figures of a size PyPI does not ship (its replies are noise; its loading, t(N) and footprint are
those of the real file).

The metadata and tokenizer come from a real GGUF of the same architecture (its vocabulary and chat
template, so the tokenizer reading costs what it costs); the shape fields are replaced, and each
matrix is random blocks of the type llama.cpp's Q4_K_M gives it (Q6_K for attn_v and ffn_down in
the layers it favours and for a tied embedding, Q4_K elsewhere).

    python benchmarks/synthetic_gguf.py /work/models/qwen2.5-coder-0.5b-instruct.gguf /tmp/qwen2-1.5b-q4km.gguf \\
        --hidden 1536 --layers 28 --ffn 8960 --heads 12 --kv-heads 2      # Qwen2.5-1.5B's shape
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_gguf import random_blocks  # noqa: E402 - the tests' writer of random ggml blocks

SHAPE_KEYS = (
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
)


def favoured(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M gives these layers' attn_v and ffn_down more bits (Q6_K)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, arch: str, shape: dict[str, int]) -> None:
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        key = field.name.removeprefix(f"{arch}.")
        if key in shape:
            writer.add_uint32(field.name, shape[key])
            continue
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a real GGUF of the architecture: metadata and tokenizer")
    parser.add_argument("output", type=Path)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--ffn", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    args = parser.parse_args()

    reader = gguf.GGUFReader(args.source)
    arch = reader.fields["general.architecture"].contents()
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    shape = dict(zip(SHAPE_KEYS, (args.layers, args.hidden, args.ffn, args.heads, args.kv_heads), strict=True))
    writer = gguf.GGUFWriter(str(args.output), arch)
    copy_metadata(reader, writer, arch, shape)
    rng = np.random.default_rng(0)
    kv = args.hidden // args.heads * args.kv_heads

    def matrix(name: str, rows: int, columns: int, ggml_type: T) -> None:
        writer.add_tensor(
            name, random_blocks(ggml_type, rows, columns, seed=len(writer.tensors[0])), raw_dtype=ggml_type
        )

    def vector(name: str, size: int, around: float) -> None:
        writer.add_tensor(name, (around + 0.02 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", vocab, args.hidden, T.Q6_K)  # tied: the output head's type
    for i in range(args.layers):
        more = T.Q6_K if favoured(i, args.layers) else T.Q4_K
        vector(f"blk.{i}.attn_norm.weight", args.hidden, 1.0)
        for part, rows, kind in (("q", args.hidden, T.Q4_K), ("k", kv, T.Q4_K), ("v", kv, more)):
            matrix(f"blk.{i}.attn_{part}.weight", rows, args.hidden, kind)
            vector(f"blk.{i}.attn_{part}.bias", rows, 0.0)
        matrix(f"blk.{i}.attn_output.weight", args.hidden, args.hidden, T.Q4_K)
        vector(f"blk.{i}.ffn_norm.weight", args.hidden, 1.0)
        matrix(f"blk.{i}.ffn_gate.weight", args.ffn, args.hidden, T.Q4_K)
        matrix(f"blk.{i}.ffn_up.weight", args.ffn, args.hidden, T.Q4_K)
        matrix(f"blk.{i}.ffn_down.weight", args.hidden, args.ffn, more)
    vector("output_norm.weight", args.hidden, 1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.output}: {args.output.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
