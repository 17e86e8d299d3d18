"""A GGUF's linear and YaRN rope scaling, and a sliding layer's own base, read as its checkpoint
rotates: llama.cpp's converter writes them as metadata (`rope.scaling.*`, `rope.freq_base_swa`) that
transformers' GGUF config maps skip (models/gguf_rope.py puts them into the config). Gemma 3 4B-27B
scale their global layers only; YaRN files (Qwen2.5, Qwen3) may carry their own betas. The file read
by tr gives the checkpoint's logits, tr equals `generate` on it, and what llama.cpp reads as no
scaling (a factor of 0, a type of none) scales nothing."""

from __future__ import annotations

import math

import pytest
import torch
from gguf import GGMLQuantizationType as T
from tiny_gguf import write_tiny_gguf
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.errors import ModelError
from tr_cli.models import Runtime, load_model

from tiny_models import COMMON, EOS, random_prompt, randomized, reference

LENGTH = 72  # past YaRN's original context below, so its ramp and attention factor both matter


def checkpoint(name: str) -> torch.nn.Module:
    """A tiny model whose checkpoint config scales its rotary embedding as real ones do."""
    if name == "linear":
        config = LlamaConfig(num_hidden_layers=2, rope_parameters={"rope_type": "linear", "factor": 4.0}, **COMMON)
        model = LlamaForCausalLM(config)
    elif name.startswith("yarn"):
        # llama.cpp's YaRN: betas 32 and 1, magnitude 0.1 ln(factor) + 1 times the file's attention
        # factor ("yarn-attention": 1.3)
        scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
        if name == "yarn-attention":
            scaling["attention_factor"] = (0.1 * math.log(4.0) + 1.0) * 1.3
        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, rope_parameters=scaling, **COMMON))
    else:  # Gemma 3 4B-27B: linear x8 on the global layers, the sliding ones on their own base
        rope = {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5_000.0},
        }
        # Six layers: the file states no layer types, and Gemma 3's pattern makes every sixth global.
        config = Gemma3TextConfig(num_hidden_layers=6, head_dim=16, sliding_window=12, rope_parameters=rope, **COMMON)
        model = Gemma3ForCausalLM(config)
    torch.manual_seed(0)
    return randomized(model)


# What llama.cpp's converter writes for each (convert_hf_to_gguf.py: rope scaling, rope theta swa).
METADATA = {
    "linear": {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0},
    "yarn": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32},
    # What a converter copies from a checkpoint that states them and llama.cpp reads for qwen2 as above.
    "yarn-ignored": {
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 32,
        "rope.scaling.yarn_beta_fast": 1.5,
        "rope.scaling.yarn_attn_factor": 1.3,
    },
    "yarn-attention": {
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 32,
        "rope.scaling.attn_factor": 1.3,
    },
    "gemma3": {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0, "rope.freq_base_swa": 5_000.0},
}


def as_gguf(tmp_path, model, metadata: dict, name: str = "m.gguf"):
    return write_tiny_gguf(tmp_path / name, model, lambda _, array: T.F32, metadata=metadata)


def loaded(path, weights: str, cache) -> torch.nn.Module:
    return load_model(str(path), Runtime.resolve("cpu", "float32", weights), cache=cache).model


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("linear", "linear"),
        ("yarn", "yarn"),
        ("yarn", "yarn-ignored"),
        ("yarn-attention", "yarn-attention"),
        ("gemma3", "gemma3"),
    ],
)
def test_a_scaled_gguf_gives_its_checkpoints_logits(tmp_path, tr_kernels, name, file):
    model = checkpoint(name)
    ours = loaded(as_gguf(tmp_path, model, METADATA[file]), "dense", tmp_path / "cache")
    unscaled = loaded(as_gguf(tmp_path, model, {}, "plain.gguf"), "dense", tmp_path / "cache")
    ids = random_prompt(LENGTH, 3)
    want = logits(model, ids)
    torch.testing.assert_close(logits(ours, ids), want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits(unscaled, ids), want, rtol=1e-2, atol=1e-2)  # the metadata matters


def test_a_factor_without_a_type_is_linear(tmp_path, tr_kernels):
    """llama.cpp's default type; older files wrote only `rope.scale_linear`."""
    model = checkpoint("linear")
    want = logits(model, random_prompt(LENGTH, 4))
    for metadata, name in (({"rope.scaling.factor": 4.0}, "factor.gguf"), ({"rope.scale_linear": 4.0}, "old.gguf")):
        ours = loaded(as_gguf(tmp_path, model, metadata, name), "dense", tmp_path / "cache")
        torch.testing.assert_close(logits(ours, random_prompt(LENGTH, 4)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "metadata",
    [
        {"rope.scaling.type": "none", "rope.scaling.factor": 4.0},
        {"rope.scaling.type": "linear", "rope.scaling.factor": 0.0},
        {"rope.scaling.type": "yarn"},
    ],
    ids=["type-none", "factor-0", "no-factor"],
)
def test_what_llama_cpp_reads_as_no_scaling_scales_nothing(tmp_path, tr_kernels, metadata):
    model = checkpoint("linear")
    ids = random_prompt(LENGTH, 5)
    plain = logits(loaded(as_gguf(tmp_path, model, {}, "plain.gguf"), "dense", tmp_path / "cache"), ids)
    ours = loaded(as_gguf(tmp_path, model, metadata), "dense", tmp_path / "cache")
    assert ours.config.rope_parameters["rope_type"] == "default"
    torch.testing.assert_close(logits(ours, ids), plain, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["yarn", "gemma3"])
def test_tr_equals_generate_on_a_scaled_gguf(tmp_path, tr_kernels, name):
    model = loaded(as_gguf(tmp_path, checkpoint(name), METADATA[name]), "int8", tmp_path / "cache")
    decoder = TokenRecyclingDecoder(model)
    for seed, length in enumerate((20, 45)):
        ids = random_prompt(length, 10 + seed)
        decoder.reset()
        assert decoder.generate(ids, StopCondition.build(24, [EOS])).tokens == reference(model, ids, 24)


@pytest.mark.parametrize(
    ("metadata", "said"),
    [
        ({"rope.scaling.type": "ntk", "rope.scaling.factor": 4.0}, "llama.rope.scaling.type is 'ntk'; tr reads"),
        ({"rope.scaling.type": "linear", "rope.scaling.factor": -2.0}, "llama.rope.scaling.factor is -2.0, not a"),
        ({"rope.scaling.factor": float("nan")}, "llama.rope.scaling.factor is nan, not a positive number"),
        (
            {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0, "rope.scaling.attn_factor": 1.3},
            r"linear rope scaling with an attention factor \(1.3",
        ),
    ],
    ids=["unknown-type", "negative", "nan", "linear-attention"],
)
def test_scaling_metadata_that_does_not_fit_is_refused(tmp_path, tr_kernels, metadata, said):
    with pytest.raises(ModelError, match=f"m.gguf: {said}"):
        loaded(as_gguf(tmp_path, checkpoint("linear"), metadata), "int8", tmp_path / "cache")


@pytest.mark.filterwarnings("ignore:.*encountered in log:RuntimeWarning")  # transformers' reading of random SSM weights
def test_a_file_without_rotary_embeddings_is_read_as_it_was(tmp_path, tr_kernels):
    """A mamba file: no rope parameters to scale (and no attention heads to count)."""
    model = MambaForCausalLM(MambaConfig(vocab_size=COMMON["vocab_size"], hidden_size=32, num_hidden_layers=2))
    ours = loaded(as_gguf(tmp_path, model.eval(), {}), "dense", tmp_path / "cache")
    assert isinstance(ours, MambaForCausalLM) and not getattr(ours.config, "rope_parameters", None)
