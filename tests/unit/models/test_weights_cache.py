"""Quantized weights kept for later starts (models/weights_cache.py): a later start takes the
stored buffers without computing them and runs the same numbers; a changed weight or a damaged
file is quantized afresh (and the file replaced), never trusted."""

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from conftest import SESSION_CACHE

from tr_cli.models import WeightsMode
from tr_cli.models.weights import Int4Linear, Int8Linear, Q4Linear, Q8Linear, quantize
from tr_cli.models.weights_cache import cache_name, remembered

from tiny_models import random_prompt, tiny_model


def buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in model.state_dict().items() if tensor.dtype != torch.float32}


def quantized(model, mode: str, path=None):
    if path is None:
        quantize(model, WeightsMode.parse(mode))
        return model, None
    with remembered(path) as memory:
        quantize(model, WeightsMode.parse(mode))
    return model, memory


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_later_start_takes_the_stored_weights_and_computes_the_same(tr_kernels, tmp_path, mode):
    path = tmp_path / "q.safetensors"
    fresh, _ = quantized(tiny_model("llama"), mode)
    first, memory = quantized(tiny_model("llama"), mode, path)
    assert path.is_file() and not memory.replaying  # nothing stored yet: computed, then kept
    written = os.stat(path).st_mtime_ns
    later, memory = quantized(tiny_model("llama"), mode, path)
    assert memory.replaying and len(memory.calls) == len(memory.stored) > 0  # every layer from the file
    assert os.stat(path).st_mtime_ns == written  # nothing new to keep
    expected = buffers(fresh)
    assert buffers(later).keys() == expected.keys() and len(expected) > 0
    assert all(torch.equal(buffers(later)[name], expected[name]) for name in expected)
    ids = torch.tensor([random_prompt(9, seed=2)])
    with torch.inference_mode():
        assert torch.equal(later(ids).logits, fresh(ids).logits)


def test_a_changed_weight_is_quantized_afresh_and_the_file_replaced(tr_kernels, tmp_path):
    path = tmp_path / "q.safetensors"
    quantized(tiny_model("llama"), "int4", path)
    changed = tiny_model("llama")
    with torch.no_grad():
        changed.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    reference, _ = quantized(tiny_model("llama"), "int4")
    with torch.no_grad():
        reference_changed = tiny_model("llama")
        reference_changed.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    reference_changed, _ = quantized(reference_changed, "int4")
    model, memory = quantized(changed, "int4", path)
    assert not memory.replaying
    expected = buffers(reference_changed)
    assert all(torch.equal(buffers(model)[name], expected[name]) for name in expected)
    assert not all(torch.equal(buffers(reference)[name], expected[name]) for name in expected)
    _, memory = quantized(reference_changed, "int4", path)  # the file now holds the changed weights
    assert memory.replaying


def test_a_damaged_file_is_recomputed_and_replaced(tr_kernels, tmp_path):
    path = tmp_path / "q.safetensors"
    quantized(tiny_model("llama"), "int4", path)
    path.write_bytes(path.read_bytes()[:1000])  # cut short
    model, memory = quantized(tiny_model("llama"), "int4", path)
    assert memory.stored == [] and not memory.replaying
    fresh, _ = quantized(tiny_model("llama"), "int4")
    assert all(torch.equal(buffers(model)[name], t) for name, t in buffers(fresh).items())
    assert quantized(tiny_model("llama"), "int4", path)[1].replaying  # replaced by a whole one


def test_the_name_follows_the_files_the_mode_and_the_code(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"x" * 10)
    kernel = tmp_path / "kernel.cpp"
    kernel.write_text("// v1")
    prefix, name = cache_name(checkpoint, "int4", "float32", (kernel,))
    assert name.startswith(prefix + "-") and name == cache_name(checkpoint, "int4", "float32", (kernel,))[1]
    assert cache_name(checkpoint, "int8", "float32", (kernel,))[0] != prefix  # another mode: kept beside
    kernel.write_text("// v2")  # the kernels' layout may have changed: a new variant of the same prefix
    changed_prefix, changed = cache_name(checkpoint, "int4", "float32", (kernel,))
    assert changed_prefix == prefix and changed != name
    (checkpoint / "model.safetensors").write_bytes(b"y" * 11)
    assert cache_name(checkpoint, "int4", "float32", (kernel,))[1] not in (name, changed)


def test_keeping_a_new_variant_removes_the_older_ones(tr_kernels, tmp_path):
    old = tmp_path / "p-old.safetensors"
    quantized(tiny_model("llama"), "int4", old)
    new = tmp_path / "p-new.safetensors"
    with remembered(new, [old]):
        quantize(tiny_model("llama"), WeightsMode.parse("int4"))
    assert new.is_file() and not old.exists()


# Every weights mode, on the kernels its dtype runs: tr's on float32, torch's on bfloat16.
REPLAYED_MODES = [
    "int4@float32",
    "int8@float32",
    "int4@bfloat16",
    "int8@bfloat16",
    "int4+bf16@bfloat16",
    "int8+bf16@bfloat16",
]


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    """tests/replay_check.py over every mode in one subprocess (a kernel that crashes on what a
    cache replays must fail the tests, not kill pytest): its output lines and exit status."""
    from tr_cli.models import native_kernels

    modes = [m for m in REPLAYED_MODES if not m.endswith("@float32") or native_kernels.unavailable() is None]
    script = Path(__file__).parents[2] / "replay_check.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(script.parent), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path_factory.mktemp("replay")), str(SESSION_CACHE / "kernels"), *modes],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return done.stdout.split("\n"), done.returncode, done.stderr


@pytest.mark.parametrize("mode", REPLAYED_MODES)
def test_a_replayed_cache_runs_every_mode_whatever_its_alignment_in_the_file(replay_run, mode):
    """A cache read back runs several-row forwards as the freshly quantized model does, with its
    tensors at either alignment safetensors gives (8 bytes): torch's int8 kernel, under the int8
    head of every bfloat16 mode, crashed (SIGSEGV) on a weight 8 bytes off 16."""
    from tr_cli.models import native_kernels

    if mode.endswith("@float32") and native_kernels.unavailable() is not None:
        pytest.skip(f"tr's kernels cannot run here: {native_kernels.unavailable()}")
    lines, status, stderr = replay_run
    for shift in (0, 8):
        assert f"ok {mode} {shift}" in lines, f"exit {status}; output {lines}; {stderr[-2000:]}"


def _stored_index(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        return json.loads(meta["index"]), {name: f.get_tensor(name) for name in f.keys()}, meta


def _rewrite(path, tensors, index, meta):
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={**meta, "index": json.dumps(index)})


def test_a_buffer_whose_bytes_changed_is_recomputed_from_there_on(tr_kernels, tmp_path):
    """A byte flipped inside a stored buffer (the CRC-32 no longer matches) is never replayed: that
    call and the later ones are computed afresh, and the file written again."""
    path = tmp_path / "q.safetensors"
    quantized(tiny_model("llama"), "int4", path)
    index, tensors, meta = _stored_index(path)
    damaged = f"3.{sorted(index[3][2])[0]}"
    tensors[damaged] = tensors[damaged].clone()
    tensors[damaged].view(-1).view(torch.uint8)[5] ^= 0x10
    _rewrite(path, tensors, index, meta)
    model, memory = quantized(tiny_model("llama"), "int4", path)
    assert not memory.replaying and len(memory.calls) == len(index)
    fresh, _ = quantized(tiny_model("llama"), "int4")
    assert all(torch.equal(buffers(model)[name], t) for name, t in buffers(fresh).items())
    assert quantized(tiny_model("llama"), "int4", path)[1].replaying  # written whole again


def test_a_buffer_not_of_its_kinds_layout_is_recomputed(tmp_path):
    """A stored buffer of another shape than its kind computes for that weight (stored so, with a
    matching CRC-32) is not replayed: torch's kernels read past what a wrong shape holds."""
    path = tmp_path / "q.safetensors"
    quantized(tiny_model("llama").bfloat16(), "int8", path)
    index, tensors, meta = _stored_index(path)
    name = "weight_int8"
    at = next(i for i, entry in enumerate(index) if name in entry[2])
    short = tensors[f"{at}.{name}"][:-16].contiguous()
    tensors[f"{at}.{name}"] = short
    index[at][2][name] = [list(short.shape), str(short.dtype), zlib.crc32(short.view(-1).view(torch.uint8).numpy())]
    _rewrite(path, tensors, index, meta)
    model, memory = quantized(tiny_model("llama").bfloat16(), "int8", path)
    assert len(memory.stored) == 0 and not memory.replaying  # dropped at that call, and the rest with it
    fresh, _ = quantized(tiny_model("llama").bfloat16(), "int8")
    assert all(torch.equal(buffers(model)[name], t) for name, t in buffers(fresh).items())


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear, Q8Linear, Q4Linear])
def test_each_kinds_layout_is_what_it_computes(kind):
    """The layout a replay is checked against is the one `_quantize` gives (any weight shape it fits)."""
    for out_features, in_features in ((64, 64), (192, 96), (48, 160)):
        weight = torch.randn(out_features, in_features)
        made = kind._quantize(weight)
        assert {name: (tuple(t.shape), t.dtype) for name, t in made.items()} == kind.layout(*weight.shape)
