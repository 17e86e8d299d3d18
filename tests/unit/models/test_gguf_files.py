"""Hostile and damaged GGUF files get one line naming the file, what is wrong and what to do,
before the load where the header tells: tensor data cut short, arrays nested thousands deep,
a `llama` file without tokenizer or weights. A full disk while caching the converted tokenizer and
config leaves nothing partial behind and says how much room it needs and where.

The files are written with the `gguf` package (llama.cpp's writer): a one-layer Llama with a
byte-level BPE tokenizer that transformers converts in seconds, then damaged."""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode
from typer.testing import CliRunner

from tr_cli.cli import app
from tr_cli.errors import ModelError, SettingError
from tr_cli.models import Runtime, WeightsMode, load_model, resolve_model
from tr_cli.models.gguf_cache import gguf_side_files
from tr_cli.models.gguf_header import MAX_ARRAY_DEPTH, GGUFError, read_header

HIDDEN, FFN, HEADS, KV_HEADS = 32, 64, 4, 2
TOKENS = [*bytes_to_unicode().values(), "Ġt", "<|endoftext|>"]  # every byte, one merge, end of text
PACKAGED = resolve_model(None).path


def tiny_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """A one-layer Llama's weights under llama.cpp's names, in torch order."""
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    kv = KV_HEADS * HIDDEN // HEADS
    return {
        "token_embd.weight": weight(len(TOKENS), HIDDEN),
        "output_norm.weight": np.ones(HIDDEN, np.float32),
        "blk.0.attn_norm.weight": np.ones(HIDDEN, np.float32),
        "blk.0.attn_q.weight": weight(HIDDEN, HIDDEN),
        "blk.0.attn_k.weight": weight(kv, HIDDEN),
        "blk.0.attn_v.weight": weight(kv, HIDDEN),
        "blk.0.attn_output.weight": weight(HIDDEN, HIDDEN),
        "blk.0.ffn_norm.weight": np.ones(HIDDEN, np.float32),
        "blk.0.ffn_gate.weight": weight(FFN, HIDDEN),
        "blk.0.ffn_up.weight": weight(FFN, HIDDEN),
        "blk.0.ffn_down.weight": weight(HIDDEN, FFN),
    }


def write_gguf(
    path: Path,
    *,
    tokenizer: bool = True,
    tensors: dict | None = None,
    strings: dict | None = None,
    matrices: gguf.GGMLQuantizationType | None = None,
    arch: str = "llama",
) -> Path:
    """A tiny `llama` GGUF (or one that calls itself `arch`); `strings`: extra string metadata
    (after the model's own); `matrices`: the ggml type the matmul weights are stored in (default
    float32)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(TOKENS)
        writer.add_token_merges(["Ġ t"])
        writer.add_token_types([1] * (len(TOKENS) - 1) + [3])  # the last is a control token
        writer.add_bos_token_id(len(TOKENS) - 1)
        writer.add_eos_token_id(len(TOKENS) - 1)
    for key, value in (strings or {}).items():
        writer.add_string(key, value)
    for name, array in (tiny_tensors() if tensors is None else tensors).items():
        if matrices is not None and array.ndim == 2 and name != "token_embd.weight":
            writer.add_tensor(name, gguf.quants.quantize(array, matrices), raw_dtype=matrices)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def nested_gguf(path: Path, depth: int) -> Path:
    """The tiny GGUF plus `x.nested`: an array of arrays of ... `depth` deep around one uint32.

    The writer would recurse once per level, so the value is spliced in for a placeholder string
    whose length keeps the data section aligned (every tensor offset stays valid)."""
    placeholder = "N" * ((depth * 12 - 4) % 32 or 32)
    data = write_gguf(path, strings={"x.nested": placeholder}).read_bytes()
    old = struct.pack("<IQ", 8, len(placeholder)) + placeholder.encode()
    new = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQI", 4, 1, 7)
    assert data.count(old) == 1 and (len(new) - len(old)) % 32 == 0
    path.write_bytes(data.replace(old, new))
    return path


def refusal(path: Path) -> str:
    with pytest.raises(ModelError) as caught:
        resolve_model(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"model {path}: ")
    return message


def quiet(message: str) -> None:
    pass


def test_the_tiny_gguf_is_whole(tmp_path):
    """The files below differ from this one only by their damage."""
    path = write_gguf(tmp_path / "tiny.gguf")
    header = read_header(path)
    assert header.data_end == path.stat().st_size
    assert header.n_parameters == sum(array.size for array in tiny_tensors().values())
    assert resolve_model(str(path)).kind == "gguf"


def test_the_packaged_gguf_passes_and_its_header_counts_its_parameters():
    header = read_header(PACKAGED)
    assert header.architecture == "llama" and header.array_lengths["tokenizer.ggml.tokens"] == 49_152
    assert header.data_end == PACKAGED.stat().st_size
    assert header.n_parameters == 134_515_008  # SmolLM2-135M's num_parameters() once converted
    assert resolve_model(None).path == PACKAGED


def cut(source: Path, target: Path, fraction: float) -> Path:
    with open(source, "rb") as f:
        target.write_bytes(f.read(int(source.stat().st_size * fraction)))
    return target


def test_truncated_tensor_data_is_refused_from_the_header(tmp_path):
    whole = write_gguf(tmp_path / "tiny.gguf")
    path = cut(whole, tmp_path / "cut.gguf", 0.6)
    message = refusal(path)
    size, left = whole.stat().st_size, path.stat().st_size
    assert f"truncated GGUF (tensor data ends at byte {size}, file has {left} bytes); download it again" in message


def test_the_packaged_model_cut_to_60_percent_is_refused(tmp_path):
    path = cut(PACKAGED, tmp_path / "SmolLM2.gguf", 0.6)
    message = refusal(path)
    assert f"tensor data ends at byte {PACKAGED.stat().st_size}, file has {path.stat().st_size} bytes" in message


def test_a_cut_inside_the_header_says_so(tmp_path):
    path = cut(write_gguf(tmp_path / "tiny.gguf"), tmp_path / "cut.gguf", 0.01)
    assert "file ends inside the header (truncated?)" in refusal(path)


def test_a_cut_inside_the_vocabulary_or_a_bogus_string_length_says_so(tmp_path):
    """The string arrays (49,152 tokens, 48,900 merges in the packaged header) are skipped in one
    tight loop: a file cut inside them, or a token whose length runs past the file, is refused."""
    header = read_header(PACKAGED)
    assert header.array_lengths["tokenizer.ggml.tokens"] == 49152
    path = tmp_path / "cut.gguf"
    with open(PACKAGED, "rb") as f:
        path.write_bytes(f.read(header.data_start // 3))
    assert "file ends inside the header (truncated?)" in refusal(path)
    raw = bytearray(PACKAGED.read_bytes()[: header.data_start])
    at = raw.find(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8  # types, count
    for _ in range(1000):  # to the 1001st token's length
        at += 8 + int.from_bytes(raw[at : at + 8], "little")
    raw[at : at + 8] = (1 << 40).to_bytes(8, "little")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match="truncated"):
        read_header(bogus)


def test_arrays_nested_ten_thousand_deep_are_refused(tmp_path):
    path = nested_gguf(tmp_path / "nested.gguf", 10_000)
    with pytest.raises(RecursionError):  # what the readers after ours do with it
        gguf.GGUFReader(str(path))
    message = refusal(path)
    assert f"metadata value 'x.nested' nests arrays more than {MAX_ARRAY_DEPTH} deep" in message


def test_the_nesting_bound_is_exact(tmp_path):
    assert read_header(nested_gguf(tmp_path / "ok.gguf", MAX_ARRAY_DEPTH)).array_lengths["x.nested"] == 1
    with pytest.raises(GGUFError, match="nests arrays"):
        read_header(nested_gguf(tmp_path / "deep.gguf", MAX_ARRAY_DEPTH + 1))


def test_a_llama_gguf_with_a_bogus_tensor_and_no_tokenizer_says_what_is_missing(tmp_path):
    path = write_gguf(tmp_path / "bogus.gguf", tokenizer=False, tensors={"bogus.weight": np.zeros((3, 5), np.float32)})
    message = refusal(path)
    assert "not a usable 'llama' GGUF" in message
    assert "no tokenizer (tokenizer.ggml.model and tokenizer.ggml.tokens absent from its metadata)" in message
    assert "no token_embd.weight tensor (its 1 tensor(s): bogus.weight)" in message


def test_a_gguf_without_tensors_is_not_called_truncated(tmp_path):
    message = refusal(write_gguf(tmp_path / "empty.gguf", tensors={}))
    assert "no token_embd.weight tensor (it has no tensors)" in message and "truncated" not in message


def test_an_embedding_that_does_not_fit_the_metadata_is_refused(tmp_path):
    tensors = tiny_tensors() | {"token_embd.weight": np.zeros((100, HIDDEN), np.float32)}
    message = refusal(write_gguf(tmp_path / "embd.gguf", tensors=tensors))
    assert f"token_embd.weight has shape [{HIDDEN}, 100], but the metadata says [{HIDDEN}, {len(TOKENS)}]" in message


def test_a_tensor_of_another_shape_than_the_config_makes_is_one_line(tmp_path):
    """Shapes the header does not pin down fail at the load, before the model is used, as one line."""
    tensors = tiny_tensors() | {"blk.0.attn_q.weight": np.zeros((5, 3), np.float32)}
    path = write_gguf(tmp_path / "q.gguf", tensors=tensors)
    resolve_model(str(path))  # nothing in the header says it is wrong
    with pytest.raises(ModelError) as caught:
        load_model(str(path), Runtime.resolve("cpu", "float32"), cache=tmp_path / "cache")
    assert str(caught.value) == (
        "model q.gguf: tensor blk.0.attn_q.weight has shape [5, 3], but its config makes [32, 32]; "
        "the file is damaged or not what its metadata says"
    )


@pytest.mark.parametrize(
    "name",
    ["cut", "nested", "bogus"],
)
def test_the_command_line_prints_one_line(tmp_path, home, monkeypatch, name):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "400")
    make = {
        "cut": lambda p: cut(write_gguf(tmp_path / "whole.gguf"), p, 0.6),
        "nested": lambda p: nested_gguf(p, 10_000),
        "bogus": lambda p: write_gguf(p, tokenizer=False, tensors={"bogus.weight": np.zeros((3, 5), np.float32)}),
    }
    path = make[name](tmp_path / f"{name}.gguf")
    out = CliRunner().invoke(app, ["generate", str(path), "-n", "4", "-p", "hi"])
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [out.output.strip()]
    assert out.output.startswith(f"tr: error: model {path}: ") and "unexpected" not in out.output


def no_partial_checkpoint(root: Path) -> bool:
    return [p.name for p in root.iterdir()] == ["hashes.json"]


def test_no_room_for_the_tokenizer_and_config_is_refused_before_converting(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "cache"
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=1_000_000))
    said = []
    with pytest.raises(ModelError) as caught:
        gguf_side_files(path, root, said.append)
    message = str(caught.value)
    assert message.startswith(
        f"model tiny.gguf: not enough disk space to cache its converted tokenizer and config in {root}"
    )
    assert "needs about 32 MB, 1 MB free" in message and "TR_HOME" in message
    assert not any(line.startswith("Reading") for line in said)
    assert no_partial_checkpoint(root)


def full_disk(self, directory, *args, **kwargs):
    """What the OS raises when the disk fills up, after writing part of a file."""
    (Path(directory) / "config.json").write_bytes(b"\0" * 4096)
    raise OSError(errno.ENOSPC, "No space left on device", str(directory))


def test_a_disk_that_fills_up_while_caching_leaves_nothing_behind(tmp_path, monkeypatch):
    from transformers import PretrainedConfig

    path = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "cache"
    monkeypatch.setattr(PretrainedConfig, "save_pretrained", full_disk)
    with pytest.raises(ModelError) as caught:
        gguf_side_files(path, root, quiet)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        f"model tiny.gguf: the disk filled up while caching its converted tokenizer and config in {root}"
    )
    assert "needs about 32 MB" in message and "free some space" in message and "TR_HOME" in message
    assert no_partial_checkpoint(root)  # the partial directory is gone

    monkeypatch.undo()  # room again: the next run converts and caches
    target = gguf_side_files(path, root, quiet)
    assert (target / "config.json").is_file() and (target / "tokenizer.json").is_file()
    assert not list(target.glob("*.safetensors"))  # the weights are read from the GGUF itself


def test_hashing_is_announced_only_when_the_file_is_really_read(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "cache"
    first: list[str] = []
    gguf_side_files(path, root, first.append)
    assert "Hashing tiny.gguf" in first and any(line.startswith("Reading") for line in first)
    again: list[str] = []
    assert gguf_side_files(path, root, again.append) == gguf_side_files(path, root, quiet)
    assert again == []  # the hash is remembered by path, size and time: nothing to announce


# --- what a later start does not repeat ----------------------------------------------------

RESOLVE_IN_A_FRESH_PROCESS = """
import json, sys
from tr_cli.errors import ModelError
from tr_cli.models import resolve_model
resolve_model(None)
try:
    resolve_model(sys.argv[1])
    refused = None
except ModelError as exc:
    refused = str(exc)
heavy = ["transformers.modeling_gguf_pytorch_utils", "transformers.integrations.gguf.gguf_tokenizer_mapping"]
print(json.dumps({"refused": refused, "imported": [name for name in heavy if name in sys.modules]}))
"""


def test_an_unsupported_architecture_is_refused_without_transformers_gguf_loader(tmp_path):
    """The header's architecture is checked against transformers' own list, in one line, before
    anything heavy, and without importing the module that holds the list under its public name
    (it imports every GGUF tokenizer converter: a start on an already converted model needs none)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path = write_gguf(tmp_path / "alien.gguf", arch="fooarch")
    supported = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
    expected = (
        f"model {path}: GGUF architecture 'fooarch' is not supported by transformers' GGUF loader "
        f"(supported: {supported}); use a transformers checkpoint instead"
    )
    assert refusal(path) == expected
    probe = subprocess.run(
        [sys.executable, "-c", RESOLVE_IN_A_FRESH_PROCESS, str(path)], capture_output=True, text=True, timeout=300
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout.splitlines()[-1]) == {"refused": expected, "imported": []}


def test_a_start_parses_the_header_once(tmp_path, monkeypatch):
    """A start resolves its model twice (its options, then its load): the second resolution takes
    the header the first one parsed (~60 ms for SmolLM2's vocabulary); a changed file is parsed again."""
    from tr_cli.engine.options import DecodingOptions
    from tr_cli.models import gguf_header

    parse, sizes = gguf_header._parse, []
    monkeypatch.setattr(gguf_header, "_parse", lambda buf, size: sizes.append(size) or parse(buf, size))
    path = write_gguf(tmp_path / "tiny.gguf", matrices=gguf.GGMLQuantizationType.Q4_1)
    DecodingOptions.parse(model=str(path), device="cpu")
    assert resolve_model(str(path)).stored_as == "Q4_1" and len(sizes) == 1
    write_gguf(path, matrices=gguf.GGMLQuantizationType.Q8_0)  # rewritten in place
    assert resolve_model(str(path)).stored_as == "Q8_0" and len(sizes) == 2
    os.utime(path, ns=(1, 1))  # same bytes, another modification time: not trusted as the same file
    assert resolve_model(str(path)).stored_as == "Q8_0" and len(sizes) == 3


def test_the_converted_tokenizer_lists_its_added_tokens_in_its_config(tmp_path):
    """transformers saves a tokenizers-backed tokenizer without its added tokens in
    tokenizer_config.json, and loading it then parses the whole tokenizer.json in Python for them
    (0.15 s of each SmolLM2 start); the conversion lists them there, and the tokenizer stays the same."""
    from transformers import AutoTokenizer

    from tr_cli.store.matrix_file import tokenizer_fingerprint

    path = write_gguf(tmp_path / "tiny.gguf")
    target = gguf_side_files(path, tmp_path / "cache", quiet)
    config = json.loads((target / "tokenizer_config.json").read_text())
    end = {"content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False}
    assert config["added_tokens_decoder"] == {str(len(TOKENS) - 1): end | {"normalized": False, "special": True}}
    ours = AutoTokenizer.from_pretrained(str(target))
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert tokenizer_fingerprint(ours) == tokenizer_fingerprint(theirs)
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    text = " t<|endoftext|>tt"
    assert ours(text).input_ids == theirs(text).input_ids and ours.all_special_ids == theirs.all_special_ids


# --- the weights a file asks for (`--weights auto`) ------------------------------------------


@pytest.mark.parametrize(
    ("stored", "expected"),
    [(gguf.GGMLQuantizationType.Q4_1, "int4"), (gguf.GGMLQuantizationType.Q8_0, "int8"), (None, "dense")],
)
def test_auto_weights_follow_the_file(tmp_path, stored, expected):
    """The header names the matmul weights' type; the default weights follow it on the CPU, and
    the banner says why. A float32 file, another device or an asked float32 run dense."""
    from tr_cli.engine.options import DecodingOptions
    from tr_cli.models.cpu import cpu_has_native_bf16

    path = write_gguf(tmp_path / "tiny.gguf", matrices=stored)
    name = "F32" if stored is None else stored.name
    assert read_header(path).matmul_type == name and resolve_model(str(path)).stored_as == name
    from tr_cli.models import native_kernels

    runtime = DecodingOptions.parse(model=str(path), device="cpu").runtime
    native, torch_kernels = cpu_has_native_bf16(), native_kernels.unavailable() is not None
    assert runtime.weights.name == (
        "dense" if expected == "dense" else expected + ("+bf16" if native and torch_kernels else "")
    )
    assert runtime.chosen_because == f"the file holds {name} weights"
    assert f"(the file holds {name} weights)" in runtime.describe()
    if expected == "dense":
        assert runtime.dtype == (torch.bfloat16 if native else torch.float32)
    elif torch_kernels:  # bfloat16
        assert runtime.dtype == torch.bfloat16 and runtime.kernels.startswith("torch's kernels")
    else:  # tr's kernels compute in float32
        assert runtime.dtype == torch.float32 and runtime.describe().endswith("float32 on tr's kernels")
    asked = DecodingOptions.parse(model=str(path), device="cpu", dtype="float32").runtime
    assert asked.weights.dense and asked.dtype == torch.float32
    if expected != "dense":
        assert asked.chosen_because == f"{name} file; dtype float32 asked"
        chosen = DecodingOptions.parse(model=str(path), device="cpu", weights="dense").runtime
        assert chosen.weights.dense and chosen.chosen_because is None  # what the user named needs no reason


@pytest.mark.parametrize("native_bf16", [False, True])
@pytest.mark.parametrize("kernels_run", [False, True])
def test_auto_weights_take_tr_kernels_wherever_they_run(monkeypatch, native_bf16, kernels_run):
    """tr's kernels (float32, the file's int4 levels) are the default on every CPU they run on,
    AVX512-BF16 and AMX ones too; only without them do the bfloat16 prompt weights come along."""
    from tr_cli.models import native_kernels, runtime

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native_bf16)
    monkeypatch.setattr(native_kernels, "unavailable", lambda: None if kernels_run else "no C++ compiler found")
    chosen = Runtime.resolve("cpu", "auto", "auto", stored_as="Q4_1")
    assert chosen.weights == WeightsMode("int4", native_bf16 and not kernels_run)
    assert chosen.dtype == (torch.float32 if kernels_run else torch.bfloat16)
    reason = "tr's kernels" if kernels_run else "torch's kernels: tr's cannot run here, no C++ compiler found"
    assert chosen.kernels == reason
    asked = Runtime.resolve("cpu", "bfloat16", "auto", stored_as="Q4_1")  # bfloat16 asked: torch's kernels
    assert asked.weights == WeightsMode("int4", native_bf16) and asked.dtype == torch.bfloat16


def test_auto_weights_rule_by_stored_type():
    from tr_cli.models.runtime import auto_weights

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    for stored, kind in (
        ("Q4_0", "int4"),
        ("Q4_K", "int4"),
        ("IQ4_XS", "int4"),
        ("Q3_K", "int4"),
        ("Q2_K", "int4"),
        ("Q5_K", "int8"),
        ("Q6_K", "int8"),
        ("Q8_0", "int8"),
    ):
        assert auto_weights(stored, cpu, "auto")[0].quantized == kind, stored
        assert auto_weights(stored, cpu, "bfloat16")[0].quantized == kind, stored
        assert auto_weights(stored, gpu, "auto") == (
            WeightsMode(),
            f"{stored} file; the quantized kernels are the CPU's",
        )
    for stored in ("F16", "BF16", "F32"):
        assert auto_weights(stored, cpu, "auto") == (WeightsMode(), f"the file holds {stored} weights")
    assert auto_weights(None, cpu, "auto") == (WeightsMode(), None)  # a checkpoint: dense, nothing to say
    with pytest.raises(SettingError, match="weights int3: unknown; use auto, dense"):
        Runtime.resolve("cpu", "auto", "int3")


def test_a_checkpoint_directory_runs_dense_without_a_reason(tiny_llama_dir):
    from tr_cli.engine.options import DecodingOptions

    runtime = DecodingOptions.parse(model=str(tiny_llama_dir), device="cpu").runtime
    assert runtime.weights.dense and runtime.chosen_because is None
