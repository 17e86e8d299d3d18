"""DecodingOptions.parse: every decoding setting checked and resolved once, errors naming the
setting (not a flag); and the one reply budget every surface asks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tr_cli.core import PRESETS
from tr_cli.core.errors import SettingError
from tr_cli.core.sampling_config import SamplingRequest
from tr_cli.core.stopping import NoRoomForReply, reply_budget
from tr_cli.engine.options import DEFAULT_MAX_NEW_TOKENS, MAX_K, DecodingOptions
from tr_cli.models import DENSE, Runtime, WeightsMode, native_kernels
from tr_cli.models.runtime import TORCH_KERNELS_WHERE_TRS_RUN


def test_the_defaults_are_one_value():
    options = DecodingOptions.parse(device="cpu", dtype="float32")
    # The packaged GGUF is Q4_1: `auto` weights would run it int4, but float32 was asked.
    assert options.runtime == Runtime(torch.device("cpu"), torch.float32, DENSE, "Q4_1 file; dtype float32 asked")
    assert DecodingOptions.parse(device="cpu").runtime.weights.quantized == "int4"
    assert options.drafts.designed and options.drafts.depth("lookup") == 10
    assert options.sampling == SamplingRequest() and not options.sampling.wants_sampling
    assert (options.k, options.save, options.cold, options.max_new_tokens) == (8, True, False, DEFAULT_MAX_NEW_TOKENS)
    assert DecodingOptions().max_new_tokens == DEFAULT_MAX_NEW_TOKENS


def test_settings_resolve_into_typed_values(tmp_path):
    options = DecodingOptions.parse(
        model="smollm2",
        device="cpu",
        weights="int4+bf16",
        tree="paper",
        lookup=6,
        k=9,
        matrix=tmp_path / "m.safetensors",
        save=False,
        temperature=0.7,
        seed=3,
        max_new_tokens=40,
    )
    assert options.runtime.weights == WeightsMode("int4", bf16_prompts=True)
    assert options.runtime.dtype == torch.bfloat16  # the quantized kernels' activations
    assert options.drafts.tree == PRESETS["paper"] and options.drafts.name == "paper+lookup6"
    assert options.sampling == SamplingRequest(temperature=0.7, seed=3) and options.sampling.wants_sampling
    assert (options.k, options.save, options.max_new_tokens) == (9, False, 40)


@pytest.mark.parametrize(
    "settings, setting, words",
    [
        ({"model": "  "}, "model", "is empty"),
        ({"k": MAX_K + 1}, "k", f"at most {MAX_K}"),
        ({"k": 0}, "k", "at least 1"),
        ({"tree": "paper", "k": 4}, "k", "uses candidate slot"),
        ({"tree": "nope"}, "tree", "unknown tree"),
        ({"lookup": 65}, "lookup", "at most 64 tokens deep"),
        ({"lookup": -1}, "lookup", "0 .off. or more"),
        ({"max_new_tokens": 0}, "max_new_tokens", "at least 1"),
        ({"device": "tpu"}, "device", "unknown device"),
        ({"dtype": "int3"}, "dtype", "unknown dtype"),
        ({"weights": "int3"}, "weights", "unknown"),
        ({"weights": "int8", "dtype": "float16"}, "weights", r"computes in float32 \(tr's kernels\) or bfloat16"),
        ({"weights": "int8+bf16", "dtype": "float32"}, "weights", "keep bfloat16 prompt weights"),
        ({"top_p": 2.0}, "top_p", "between 0 and 1"),
        ({"temperature": -1.0}, "temperature", r"0 \(greedy\) or more"),
        ({"temperature": 0.0, "top_k": 5}, "top_k", "temperature 0 is greedy"),
        ({"seed": -1}, "seed", "must be between 0"),
    ],
)
def test_bad_settings_name_the_setting(settings, setting, words):
    with pytest.raises(SettingError, match=words) as caught:
        DecodingOptions.parse(**{"device": "cpu", **settings})
    assert caught.value.setting == setting
    assert "--" not in str(caught.value)  # below the command line, no flags


def test_a_directory_is_not_a_matrix_file(tmp_path: Path):
    with pytest.raises(SettingError, match="not a file"):
        DecodingOptions.parse(device="cpu", matrix=tmp_path)


def test_weights_modes_parse_and_print_back():
    for name in ("dense", "int8", "int4", "int8+bf16", "int4+bf16"):
        assert WeightsMode.parse(name).name == name == str(WeightsMode.parse(name))
    assert WeightsMode.parse("dense") is DENSE and DENSE.dense
    with pytest.raises(ValueError):
        WeightsMode(None, bf16_prompts=True)
    torch_kernels = "torch's kernels" if native_kernels.unavailable() else TORCH_KERNELS_WHERE_TRS_RUN
    assert Runtime.resolve("cpu", "bfloat16", "int8").describe() == f"int8 weights, bfloat16 on {torch_kernels}"
    assert Runtime.resolve("cpu", "float32").describe() == "float32"


def test_quantized_weights_run_on_the_cpu_only():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SettingError) as caught:
        Runtime.resolve("cuda", "auto", "int4")
    assert caught.value.setting == "device"  # no CUDA here at all: the device is what cannot run


def test_reply_budget_clamps_to_the_context_and_refuses_what_leaves_no_room():
    assert reply_budget(100, None, 5000, 5000, 10) == 100  # no stated context: as asked
    assert reply_budget(100, 1000, 0, 200, 10) == 100
    assert reply_budget(100, 1000, 500, 450, 10) == 40
    with pytest.raises(NoRoomForReply) as caught:
        reply_budget(100, 1000, 500, 490, 10)
    assert (caught.value.context, caught.value.max_depth) == (1000, 10)
