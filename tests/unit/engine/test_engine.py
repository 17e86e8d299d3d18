"""Device fitting state on disk: t(N) calibrations cached per device and model, acceptance
statistics kept beside their matrix, the decoder built for a --tree choice, and the engine's save
(the conversation joins the recycled store)."""

from __future__ import annotations

import json

import pytest
import torch

from tr_cli.core import PRESETS, TokenRecyclingDecoder
from tr_cli.core.design.acceptance_stats import AcceptanceStats
from tr_cli.core.design.cost_model import CALIBRATION_SIZES
from tr_cli.core.drafters import ConversationLookupDrafter, DraftPlan, MatrixTreeDrafter, StoreLookupDrafter
from tr_cli.engine.calibration import load_or_calibrate
from tr_cli.engine.engine import Engine
from tr_cli.engine.options import DecodingOptions
from tr_cli.store.acceptance_file import acceptance_path, load_acceptance, save_acceptance
from tr_cli.store.hot_matrix import Saved
from tr_cli.store.recycled_file import read_recycled_store, recycled_store_path

from tiny_models import tiny_model

# These tests are about the cache, not the machine: cache whatever else runs meanwhile.
ANY_LOAD = float("inf")


def test_stats_live_beside_the_matrix(tmp_path):
    matrix_path = tmp_path / "m.safetensors"
    assert acceptance_path(matrix_path) == tmp_path / "m.accept.json"
    fresh, problem = load_acceptance(matrix_path, 8, "cpu")
    assert fresh.observed_steps == 0 and problem is None
    stats = AcceptanceStats(8)
    stats.load_dict({"k": 8, "hits": [[5] * 8], "trials": [[9] * 8]})
    save_acceptance(matrix_path, stats)
    again, problem = load_acceptance(matrix_path, 8, "cpu")
    assert again.to_dict() == stats.to_dict() and problem is None
    assert not list(tmp_path.glob("*.tmp"))


def test_unreadable_stats_start_from_the_prior_and_are_kept_aside(tmp_path):
    matrix_path = tmp_path / "m.safetensors"
    acceptance_path(matrix_path).write_text("{not json")
    stats, problem = load_acceptance(matrix_path, 8, "cpu")
    assert stats.observed_steps == 0 and problem.startswith(f"{acceptance_path(matrix_path)}: unusable")
    save_acceptance(matrix_path, stats)
    kept = list(tmp_path.glob("m.accept.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == "{not json"
    assert json.loads(acceptance_path(matrix_path).read_text())["k"] == 8
    # Statistics for another k are not adopted.
    acceptance_path(matrix_path).write_text(json.dumps({"k": 4, "hits": [[1] * 4], "trials": [[2] * 4]}))
    stats, problem = load_acceptance(matrix_path, 8, "cpu")
    assert stats.observed_steps == 0 and "k=4, expected k=8" in problem


def test_calibration_is_measured_once_then_read_back(home):
    model = tiny_model("llama")
    decoder = TokenRecyclingDecoder(model)
    messages: list[str] = []
    cost = load_or_calibrate(decoder, "tiny-llama", status=messages.append, busy_cores=ANY_LOAD)
    assert cost.sizes == CALIBRATION_SIZES
    assert list(cost.seconds) == sorted(cost.seconds) and cost.seconds[0] > 0
    assert len(messages) == 1
    files = list((home / "data" / "calibration").glob("*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert record["model"] == "tiny-llama" and record["dtype"] == "torch.float32"
    again = load_or_calibrate(TokenRecyclingDecoder(model), "tiny-llama", status=messages.append, busy_cores=ANY_LOAD)
    assert again == cost and len(messages) == 1  # read back, not measured
    # Another dtype (or model) is another calibration.
    bf16 = TokenRecyclingDecoder(tiny_model("llama", dtype=torch.bfloat16))
    load_or_calibrate(bf16, "tiny-llama", status=messages.append, busy_cores=ANY_LOAD)
    assert len(messages) == 2
    assert len(list((home / "data" / "calibration").glob("*.json"))) == 2


def test_calibration_leaves_the_conversation_cache_alone(home):
    from tr_cli.core import StopCondition

    model = tiny_model("qwen2")
    decoder = TokenRecyclingDecoder(model)
    decoder.generate([5, 6, 7, 8, 9], StopCondition.build(6, [3]))
    length, tokens = decoder.cached_length, list(decoder.tokens)
    decoder.measure_cost(sizes=(1, 4), repeats=1)
    assert decoder.cached_length == length and decoder.tokens == tokens


def test_engine_designs_a_tree_for_auto_that_drafts_from_the_store(home, tiny_llama_dir):
    from tr_cli.core import StopCondition

    options = DecodingOptions.parse(model=str(tiny_llama_dir), device="cpu", dtype="float32", tree="auto")
    engine = Engine.open(options)
    auto = engine.decoder
    assert auto.designed and auto.tree.name.startswith("auto")
    assert [type(d) for d in auto.drafters] == [MatrixTreeDrafter, ConversationLookupDrafter, StoreLookupDrafter]
    assert auto.drafters[-1].store is engine.hot.store
    fixed = engine.make_decoder(DraftPlan.parse("paper"), fork=True)
    assert not fixed.designed and fixed.tree == PRESETS["paper"] and len(fixed.drafters) == 1  # the paper's method
    assert fixed.matrix is not auto.matrix and torch.equal(fixed.matrix, auto.matrix)  # a copy, never saved
    forked = engine.make_decoder(DraftPlan.parse("auto+lookup0"), fork=True)
    assert forked.drafters[-1].store is not engine.hot.store  # a fork's conversations stay its own

    started = len(engine.hot.store.documents)  # the starter's, for this (SmolLM2's) tokenizer
    prompt = engine.loaded.tokenizer.encode("The cat sat on the mat and then the cat")
    auto.generate(prompt, StopCondition.build(6, []))
    conversation = list(auto.tokens)
    # A periodic save (a chat going on) keeps the conversation in the decoder.
    periodic = engine.save(end_conversation=False)
    assert periodic.documents == 0 and auto.tokens == conversation
    saved = engine.save()
    assert saved.documents == 1 and saved.tokens == len(conversation) and auto.tokens == []
    stored = read_recycled_store(recycled_store_path(engine.hot.path))
    assert [doc.tokens.tolist() for doc in stored.documents[started:]] == [conversation]
    assert engine.save() == Saved()  # nothing new


def test_no_save_and_a_fixed_tree_leave_the_store_alone(home, tiny_llama_dir):
    from tr_cli.core import StopCondition

    options = DecodingOptions.parse(model=str(tiny_llama_dir), device="cpu", dtype="float32", tree="paper", save=False)
    engine = Engine.open(options)
    assert len(engine.decoder.drafters) == 1
    engine.decoder.generate(
        engine.loaded.tokenizer.encode("Hello there, how are you today?"), StopCondition.build(4, [])
    )
    assert engine.save() == Saved()
    assert not engine.hot.path.exists() and not recycled_store_path(engine.hot.path).exists()


def test_a_dense_load_is_refused_where_the_device_has_no_bfloat16(monkeypatch):
    """Engine.dense_load says why in one line before loading anything (a GPU that only emulates
    bfloat16 counts as without it)."""
    from tr_cli.core.sampling_config import SamplingConfig
    from tr_cli.errors import SettingError
    from tr_cli.models import LoadedModel, ModelSource, Runtime

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    source = ModelSource("directory", "tiny", None)
    loaded = LoadedModel(tiny_model("llama"), None, source, Runtime(torch.device("cuda"), torch.float16))
    engine = Engine(loaded, SamplingConfig.greedy())
    with pytest.raises(SettingError) as caught:
        engine.dense_load(torch.bfloat16)
    assert str(caught.value) == "dtype bfloat16: the Tesla T4 has no native bfloat16"
    assert engine.dense_load(torch.float16) is loaded  # already dense in that dtype: itself
