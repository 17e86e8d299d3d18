"""A LongRoPE GGUF (Phi-3.5-mini, Phi-4-mini: architecture phi3) read as its checkpoint rotates:
llama.cpp's converter keeps the short and long factors as tensors and the pretraining context and
attention factor as metadata, which transformers' GGUF readers skip (models/gguf_rope.py puts them
into the config). The file, read by tr, gives the checkpoint's own logits before and past the
pretraining context; tr equals `generate` on it, whose context stops at the pretraining one; factors
that do not fit are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from tiny_gguf import write_tiny_gguf
from transformers import Phi3Config, Phi3ForCausalLM

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.errors import ModelError
from tr_cli.models import Runtime, load_model

from tiny_models import random_prompt, randomized, reference

HEAD_DIM, ORIGINAL, LONGEST = 16, 48, 768
THETA = 10000.0
# The converter's attention factor is sqrt(1 + ln(LONGEST / ORIGINAL) / ln(ORIGINAL)), which is also
# transformers' default: another value shows that the file's is the one read.
ATTENTION = 1.25


def longrope_checkpoint(partial: float, attention: float | None = None) -> Phi3ForCausalLM:
    """A tiny Phi-3 with LongRoPE as a checkpoint's config.json says it, factors well away from 1."""
    pairs = int(HEAD_DIM * partial) // 2
    scaling = {
        "rope_type": "longrope",
        "rope_theta": THETA,
        "partial_rotary_factor": partial,
        "short_factor": [1.0 + 0.25 * i for i in range(pairs)],
        "long_factor": [2.0 + 3.0 * i for i in range(pairs)],
        "original_max_position_embeddings": ORIGINAL,
        "attention_factor": ATTENTION if attention is None else attention,
    }
    config = Phi3Config(
        vocab_size=32064,  # its config's default pad id, 32000, must fit
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=LONGEST,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters=scaling,
        eos_token_id=3,
        bos_token_id=1,
    )
    torch.manual_seed(0)
    model = Phi3ForCausalLM(config)
    return randomized(model)


def as_gguf(tmp_path, model: Phi3ForCausalLM, short=None, long=None, drop: str | None = None):
    """The checkpoint as llama.cpp's converter writes it: float32 tensors, the factors as tensors,
    the pretraining context, the attention factor (unless it is 1: older files have none) and the
    rotary dims as metadata."""
    scaling = model.config.rope_parameters
    extra = {
        "rope_factors_short.weight": np.array(scaling["short_factor"] if short is None else short, np.float32),
        "rope_factors_long.weight": np.array(scaling["long_factor"] if long is None else long, np.float32),
    }
    if drop is not None:
        del extra[drop]
    metadata = {
        "rope.scaling.original_context_length": ORIGINAL,
        "rope.dimension_count": int(HEAD_DIM * scaling["partial_rotary_factor"]),
    }
    if scaling["attention_factor"] != 1.0:
        metadata["rope.scaling.attn_factor"] = scaling["attention_factor"]
    return write_tiny_gguf(tmp_path / "phi.gguf", model, lambda name, array: T.F32, extra=extra, metadata=metadata)


def loaded(path, weights: str, cache) -> torch.nn.Module:
    return load_model(str(path), Runtime.resolve("cpu", "float32", weights), cache=cache).model


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("partial", [1.0, 0.75])
def test_a_longrope_gguf_gives_its_checkpoints_logits(tmp_path, tr_kernels, partial):
    checkpoint = longrope_checkpoint(partial)
    ours = loaded(as_gguf(tmp_path, checkpoint), "dense", tmp_path / "cache")
    assert ours.model.rotary_emb.attention_scaling == pytest.approx(checkpoint.model.rotary_emb.attention_scaling)
    assert ours.model.rotary_emb.attention_scaling > 1.1
    plain = Phi3ForCausalLM(Phi3Config(**{**checkpoint.config.to_dict(), "rope_parameters": None})).eval()
    plain.load_state_dict(checkpoint.state_dict())
    # Before the pretraining context (short factors) and past it (long ones, over the whole sequence).
    for length in (ORIGINAL - 8, ORIGINAL + 40):
        ids = random_prompt(length, length)
        want = logits(checkpoint, ids)
        torch.testing.assert_close(logits(ours, ids), want, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(logits(plain, ids), want, rtol=1e-2, atol=1e-2)  # the factors matter here


def test_without_an_attention_factor_a_longrope_gguf_scales_cos_and_sin_by_one(tmp_path, tr_kernels):
    """As llama.cpp does, not transformers' default for a checkpoint that states none."""
    checkpoint = longrope_checkpoint(1.0, attention=1.0)
    ours = loaded(as_gguf(tmp_path, checkpoint), "dense", tmp_path / "cache")
    assert ours.model.rotary_emb.attention_scaling == 1.0
    ids = random_prompt(ORIGINAL - 8, 2)
    torch.testing.assert_close(logits(ours, ids), logits(checkpoint, ids), rtol=1e-4, atol=1e-4)


def test_tr_equals_generate_on_a_longrope_gguf_within_its_pretraining_context(tmp_path, tr_kernels):
    """Its context stops there (models/load.py): past it `generate` recomputes every position with
    the long factors, which a kept KV cache cannot follow."""
    load = load_model(
        str(as_gguf(tmp_path, longrope_checkpoint(0.75))), Runtime.resolve("cpu", "float32", "int8"), cache=tmp_path
    )
    assert load.context_length == ORIGINAL
    model = load.model
    decoder = TokenRecyclingDecoder(model)
    ids = random_prompt(20, 5)
    assert decoder.generate(ids, StopCondition.build(16, [3])).tokens == reference(model, ids, 16)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("count", "rope_factors_short.weight holds 7 factors for 8 rotary frequencies"),
        ("zero", "rope_factors_long.weight holds factors that are not positive numbers"),
        ("nan", "rope_factors_short.weight holds factors that are not positive numbers"),
        ("one", "holds rope_factors_short.weight but no rope_factors_long.weight"),
    ],
)
def test_longrope_factors_that_do_not_fit_are_refused(tmp_path, tr_kernels, damage, said):
    checkpoint = longrope_checkpoint(1.0)
    short, long = list(checkpoint.config.rope_parameters["short_factor"]), None
    if damage == "count":
        short = short[:-1]
    elif damage == "zero":
        long = [0.0, *checkpoint.config.rope_parameters["long_factor"][1:]]
    elif damage == "nan":
        short[2] = float("nan")
    path = as_gguf(tmp_path, checkpoint, short, long, drop="rope_factors_long.weight" if damage == "one" else None)
    with pytest.raises(ModelError, match=f"phi.gguf: {said}"):
        loaded(path, "int8", tmp_path / "cache")
