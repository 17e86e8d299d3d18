"""A GGUF of a real model's shape and quantization mix with random weights, for start-up and memory
figures of a size PyPI does not ship (its replies are noise; its loading, t(N) and footprint are
those of the real file).

The metadata and tokenizer come from a real GGUF of the same architecture (its vocabulary and chat
template, so the tokenizer reading costs what it costs); the shape fields are replaced, and each
matrix is random blocks of the type llama.cpp's Q4_K_M gives it (Q6_K for attn_v and ffn_down in
the layers it favours and for a tied embedding, Q4_K elsewhere; Q5_0 and Q8_0 in their place for a
matrix whose rows are not whole 256-value k-quant blocks, as llama.cpp falls back). A layer holds
the tensors the source's first layer holds (Qwen2's biases, Gemma 3's q/k and sandwich norms).

    python benchmarks/synthetic_gguf.py /work/models/qwen2.5-coder-0.5b-instruct.gguf /tmp/qwen2-1.5b-q4km.gguf \\
        --hidden 1536 --layers 28 --ffn 8960 --heads 12 --kv-heads 2      # Qwen2.5-1.5B's shape
    python benchmarks/synthetic_gguf.py /work/models/gemma-3-270m-q4_k_m.gguf /tmp/gemma3-1b-q4km.gguf \\
        --hidden 1152 --layers 26 --ffn 6912 --heads 4 --kv-heads 1 --head-dim 256   # Gemma 3 1B's shape
    python benchmarks/synthetic_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/llama-3b-q4km.gguf \\
        --hidden 3072 --layers 28 --ffn 8192 --heads 24 --kv-heads 8      # Llama 3.2 3B's shape (49k vocabulary)
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


# llama.cpp's type for a k-quant matrix whose rows are not whole 256-value blocks.
FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}


def quant_type(wanted: T, columns: int) -> T:
    return wanted if columns % 256 == 0 else FALLBACK[wanted]


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
    parser.add_argument("--head-dim", type=int, help="where it is not hidden / heads (Gemma's)")
    args = parser.parse_args()

    reader = gguf.GGUFReader(args.source)
    arch = reader.fields["general.architecture"].contents()
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    head_dim = args.head_dim or args.hidden // args.heads
    shape = dict(zip(SHAPE_KEYS, (args.layers, args.hidden, args.ffn, args.heads, args.kv_heads), strict=True))
    # rope.dimension_count too: transformers reads a llama file's head size from it
    shape |= {key: head_dim for key in ("attention.key_length", "attention.value_length", "rope.dimension_count")}
    writer = gguf.GGUFWriter(str(args.output), arch)
    copy_metadata(reader, writer, arch, shape)
    rng = np.random.default_rng(0)
    q, kv = head_dim * args.heads, head_dim * args.kv_heads
    # (rows, columns) of each matrix a layer holds, by its name in the file
    matrices = {
        "attn_q": (q, args.hidden),
        "attn_k": (kv, args.hidden),
        "attn_v": (kv, args.hidden),
        "attn_output": (args.hidden, q),
        "ffn_gate": (args.ffn, args.hidden),
        "ffn_up": (args.ffn, args.hidden),
        "ffn_down": (args.hidden, args.ffn),
    }
    vectors = {"attn_q.bias": q, "attn_k.bias": kv, "attn_v.bias": kv, "attn_q_norm": head_dim, "attn_k_norm": head_dim}
    layer_tensors = [t.name.removeprefix("blk.0.") for t in reader.tensors if t.name.startswith("blk.0.")]

    def matrix(name: str, rows: int, columns: int, wanted: T) -> None:
        ggml_type = quant_type(wanted, columns)
        writer.add_tensor(
            name, random_blocks(ggml_type, rows, columns, seed=len(writer.tensors[0])), raw_dtype=ggml_type
        )

    def vector(name: str, size: int, around: float) -> None:
        writer.add_tensor(name, (around + 0.02 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", vocab, args.hidden, T.Q6_K)  # tied: the output head's type
    for i in range(args.layers):
        more = T.Q6_K if favoured(i, args.layers) else T.Q4_K
        for tensor in layer_tensors:
            part, _, kind = tensor.rpartition(".")
            if kind == "weight" and part in matrices:
                matrix(f"blk.{i}.{tensor}", *matrices[part], more if part in ("attn_v", "ffn_down") else T.Q4_K)
            elif kind == "bias":
                vector(f"blk.{i}.{tensor}", vectors[tensor], 0.0)
            else:  # a norm: over one head where it is a q/k norm, else over the hidden size
                vector(f"blk.{i}.{tensor}", vectors.get(part, args.hidden), 1.0)
    vector("output_norm.weight", args.hidden, 1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.output}: {args.output.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
