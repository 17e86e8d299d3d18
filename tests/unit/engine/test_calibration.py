"""The t(N) calibration cache: keyed by the model's shape (not where its files are), read back
across directories, re-measured over a bad cached file, and never fatal when it cannot be written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tr_cli.core import TokenRecyclingDecoder
from tr_cli.core.design.cost_model import CALIBRATION_SIZES
from tr_cli.engine.calibration import calibration_key, load_or_calibrate
from tr_cli.errors import StoreError
from tr_cli.store.calibration import calibration_path, read_calibration

from tiny_models import COMMON, tiny_model

# These tests are about the cache, not the machine: cache whatever else runs meanwhile.
ANY_LOAD = float("inf")


def _key(model: torch.nn.Module, k: int = 8) -> str:
    return calibration_key(model, torch.device("cpu"), next(model.parameters()).dtype, k)


def _saved_and_loaded(model: torch.nn.Module, directory: Path, **kwargs) -> torch.nn.Module:
    model.save_pretrained(directory)
    return AutoModelForCausalLM.from_pretrained(directory, **kwargs).eval()


def test_the_key_is_the_same_wherever_the_model_is_loaded_from(tmp_path):
    model = tiny_model("llama")
    first = _saved_and_loaded(model, tmp_path / "a")
    second = _saved_and_loaded(model, tmp_path / "elsewhere" / "b")
    assert first.config._name_or_path != second.config._name_or_path  # what used to change the key
    assert _key(first) == _key(second)
    # Saving adds `architectures` and `dtype` to the config; neither changes what a step computes.
    assert _key(model) == _key(first)
    # Other weights of the same shape cost the same.
    assert _key(tiny_model("llama", seed=1)) == _key(model)


def test_the_key_changes_with_the_shape_dtype_attention_k_and_forward_path(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = tiny_model("llama")
    base = _key(model)
    deeper = LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, **COMMON))
    wider = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **(COMMON | {"hidden_size": 128})))
    eager = _saved_and_loaded(model, tmp_path / "m", attn_implementation="eager")
    keys = {
        base,
        _key(deeper),
        _key(wider),
        _key(tiny_model("llama", dtype=torch.bfloat16)),
        _key(eager),
        _key(model, k=4),
        _key(tiny_model("qwen2")),  # same sizes, another architecture
        calibration_key(model, torch.device("cpu"), torch.float32, 8, "direct"),  # another forward path
    }
    assert len(keys) == 8


def test_a_moved_checkpoint_reads_the_measurement_back(home, tmp_path):
    model = tiny_model("llama")
    first, second = tmp_path / "a", tmp_path / "b"
    messages: list[str] = []
    cost = load_or_calibrate(
        TokenRecyclingDecoder(_saved_and_loaded(model, first)), str(first), status=messages.append, busy_cores=ANY_LOAD
    )
    assert len(messages) == 1  # measured
    again = load_or_calibrate(
        TokenRecyclingDecoder(_saved_and_loaded(model, second)), str(second), status=messages.append
    )
    assert again == cost and len(messages) == 1  # read back: another directory and id, same shape
    assert len(list((home / "data" / "calibration").glob("*.json"))) == 1


def test_an_unwritable_data_dir_keeps_the_measurement_and_warns(home):
    # A regular file where the data dir should be: the cache cannot be created (as root, chmod
    # would not stop the write; this fails the same mkdir/write an unwritable dir does).
    (home / "data").write_text("not a directory\n")
    decoder = TokenRecyclingDecoder(tiny_model("llama"))
    messages: list[str] = []
    warnings: list[str] = []
    cost = load_or_calibrate(decoder, "tiny-llama", status=messages.append, warn=warnings.append, busy_cores=ANY_LOAD)
    assert cost.sizes == CALIBRATION_SIZES and cost.seconds[0] > 0
    assert len(messages) == 1 and messages[0].startswith("Measuring")
    key = calibration_key(decoder.model, decoder.device, torch.float32, decoder.k, decoder.forward_pass.name)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(f"could not save the t(N) calibration to {calibration_path(key)} (")
    # Without a warn callback the failure still reaches the user, through status.
    messages.clear()
    assert (
        load_or_calibrate(decoder, "tiny-llama", status=messages.append, busy_cores=ANY_LOAD).sizes == CALIBRATION_SIZES
    )
    assert len(messages) == 2 and messages[1].startswith("could not save the t(N) calibration")
    assert (home / "data").read_text() == "not a directory\n"


def test_a_cached_file_that_is_not_a_calibration_is_a_store_error(home):
    path = calibration_path("k")
    assert read_calibration("k") is None  # absent: nothing to say
    path.parent.mkdir(parents=True)
    for content in [b"not json", b"\xff\xfe", b"[]", json.dumps({"sizes": [1, 2], "seconds": [0, 1]}).encode()]:
        path.write_bytes(content)
        with pytest.raises(StoreError, match=f"^{re.escape(str(path))}: not a usable t\\(N\\) calibration \\("):
            read_calibration("k")


def test_a_bad_cached_calibration_is_measured_again_and_replaced(home):
    decoder = TokenRecyclingDecoder(tiny_model("llama"))
    key = calibration_key(decoder.model, decoder.device, torch.float32, decoder.k, decoder.forward_pass.name)
    path = calibration_path(key)
    path.parent.mkdir(parents=True)
    path.write_text("{truncated")
    messages: list[str] = []
    warnings: list[str] = []
    cost = load_or_calibrate(decoder, "tiny-llama", status=messages.append, warn=warnings.append, busy_cores=ANY_LOAD)
    assert cost.sizes == CALIBRATION_SIZES and not warnings
    assert messages[0].startswith(f"{path}: not a usable t(N) calibration (") and "\n" not in messages[0]
    assert messages[0].endswith("; measuring step cost t(N) again") and len(messages) == 1
    assert json.loads(path.read_text())["sizes"] == list(CALIBRATION_SIZES)  # replaced by a good one
    messages.clear()
    assert (
        load_or_calibrate(decoder, "tiny-llama", status=messages.append, busy_cores=ANY_LOAD) == cost and not messages
    )


@pytest.mark.slow  # starts a subprocess that keeps a core busy
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="other processes' CPU time is read from /proc/stat")
def test_a_measurement_taken_while_the_machine_is_busy_is_used_but_not_cached(home):
    """A t(N) measured beside another heavy process is several times too high; cached, it would
    size every later tree from it. A real competitor (a busy loop) runs during the measurement."""
    decoder = TokenRecyclingDecoder(tiny_model("llama"))
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it reach its loop
        warnings: list[str] = []
        cost = load_or_calibrate(decoder, "tiny-llama", warn=warnings.append, busy_cores=0.3)
    finally:
        competitor.kill()
        competitor.wait()
    # Measured all the same (the competitor's pauses may make small sizes look steep: a prefix).
    assert len(cost.sizes) >= 2 and cost.sizes == CALIBRATION_SIZES[: len(cost.sizes)]
    assert len(warnings) == 1 and re.match(
        r"other processes kept \d+\.\d cores busy while t\(N\) was measured", warnings[0]
    )
    assert not list((home / "data" / "calibration").glob("*.json"))
