"""Quantized weights kept for later starts (models/weights_cache.py): a later start takes the
stored buffers without computing them and runs the same numbers; a changed weight or a damaged
file is quantized afresh (and the file replaced), never trusted."""

import os

import pytest
import torch

from tr_cli.models import WeightsMode
from tr_cli.models.weights import quantize
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
