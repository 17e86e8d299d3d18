"""METHOD@bf16: transformers' generate (or our decoders) on the model file loaded again, dense
bfloat16, beside whatever the bench loaded: its name, its errors, what its tokens are compared
with, what speedups are over, and that its tokens are generate's on a bfloat16 load."""

import pytest
import torch

from tr_cli.bench.methods import (
    BF16,
    check_device,
    counterpart,
    model_of,
    parse_methods,
    speedup_reference,
    variant_loads,
)
from tr_cli.bench.metrics import summarize
from tr_cli.bench.report import environment_line, rows
from tr_cli.bench.run import Run
from tr_cli.bench.runner import run_bench, running_speedups
from tr_cli.core.drafters import DraftPlan
from tr_cli.errors import SettingError
from tr_cli.models import WeightsMode
from tr_cli.text.prompts import PromptRecord


def test_bf16_variants_parse_to_a_dense_load():
    names = ["baseline@bf16", "pld@bf16", "ar@bf16", "tr@bf16", "tr:paper@bf16", "tr@int4+bf16"]
    methods = parse_methods(names, DraftPlan.of(), 8)
    assert [m.weights for m in methods] == [BF16] * 5 + [WeightsMode("int4", bf16_prompts=True)]
    assert BF16.dtype == torch.bfloat16 and str(BF16) == "bf16"
    assert methods[0].plan is None and not methods[0].prompt_lookup and methods[1].prompt_lookup
    assert methods[3].plan == DraftPlan.of() and not methods[3].on_engine_decoder  # a copy of the matrix


@pytest.mark.parametrize(
    "name, words",
    [
        ("tr@dense", "weights dense: not a variant; use @int8, @int4, @int8+bf16, @int4+bf16 (a quantized copy"),
        ("baseline@fp16", "weights fp16: unknown; use @int8"),
        ("baseline@bf16+int4", "weights bf16+int4: unknown"),
        ("llama.cpp@bf16", "llama.cpp runs the GGUF file on its own kernels; it takes no @variant"),
        ("tr@bf16@int8", "unknown method"),
    ],
)
def test_bad_variants_are_refused_with_the_choices(name, words):
    with pytest.raises(SettingError) as caught:
        parse_methods([name], DraftPlan.of(), 8)
    assert caught.value.setting == "methods" and caught.value.value == name
    assert words in caught.value.reason
    if name.startswith(("tr@dense", "baseline@fp16")):  # the weights named: the choices listed
        assert "or @bf16 (the model file loaded again, dense bfloat16)" in caught.value.reason


def test_bf16_is_refused_before_loading_where_the_device_has_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    methods = parse_methods(["baseline", "baseline@bf16"], DraftPlan.of(), 8)
    check_device(methods, torch.device("cpu"))  # the CPU computes in every dtype
    check_device(methods[:1], torch.device("cuda"))  # nothing asks for bfloat16
    with pytest.raises(SettingError) as caught:
        check_device(methods, torch.device("cuda"))
    assert (caught.value.setting, caught.value.value) == ("methods", "baseline@bf16")
    assert caught.value.reason == (
        "runs on the model loaded in bfloat16, and the Tesla T4 has no native bfloat16; drop it or use the cpu device"
    )


def fake_runner(tokens: list[int], seconds: float):
    return lambda ids, n, grammar: Run(tokens[:n], seconds, len(tokens[:n]) - 1, first_token_seconds=seconds / 4)


def test_bf16_is_its_own_reference_and_speedups_are_over_it_without_baseline():
    """baseline@bf16 is compared with itself (its weights give their own tokens), tr@bf16 with
    it; without `baseline` every speedup is over baseline@bf16, which the report records."""
    assert counterpart("baseline@bf16", "baseline") == "baseline@bf16"
    assert counterpart("tr@bf16", "baseline") == "baseline@bf16" and counterpart("tr@bf16", "ar") == "ar@bf16"
    assert speedup_reference(["ar", "baseline@int8", "baseline@bf16"]) == "baseline@int8"  # the first
    assert speedup_reference(["baseline@bf16", "baseline"]) == "baseline"
    assert speedup_reference(["ar", "tr"]) is None

    prompts = [PromptRecord("a", "qa", ("xx",))]
    loaded, bf16 = [1, 2, 3, 4, 5], [1, 2, 9, 9, 9]
    runners = {
        "baseline@bf16": fake_runner(bf16, 4.0),
        "tr@bf16": fake_runner(bf16, 2.0),
        "ar": fake_runner(loaded, 2.0),
        "tr": fake_runner(loaded, 1.0),
    }
    results = run_bench(runners, prompts, encode=lambda h, t: [0] * len(t), decode=str, max_new_tokens=10, warmup=0)
    assert running_speedups(results) == {"tr@bf16": 2.0, "ar": 2.0, "tr": 4.0}
    report = summarize(results, {"model": "fake"})
    methods = report["methods"]
    assert report["environment"]["speedup_over"] == "baseline@bf16"
    assert [methods[m]["speedup"] for m in runners] == [1.0, 2.0, 2.0, 4.0]
    assert methods["baseline@bf16"]["decode_speedup"] == 1.0 and methods["tr"]["decode_speedup"] == 4.0
    assert report["categories"]["qa"]["tr"]["speedup"] == 4.0
    assert methods["tr"]["speedup_vs_ar"] == 2.0 and methods["tr@bf16"]["speedup_vs_ar"] is None  # no ar@bf16
    identical = [methods[m]["identical_to_baseline"] for m in runners]
    assert identical == [1, 1, None, None]  # tr has no `baseline` on its weights in this run
    assert [row[-1] for row in rows(report)[1]] == ["1/1", "1/1", "–", "–"]
    assert "speedup_over: baseline@bf16" in environment_line(report["environment"])
    env = {"model": "m", "variant_loads": {"bf16": {"dtype": "bfloat16", "weights": "dense", "second_load": True}}}
    assert environment_line(env) == "model: m · variant_loads: @bf16 dense bfloat16 (a second load)"


# --- on a real (tiny, random) checkpoint -----------------------------------------------------


def test_bf16_variant_is_generate_on_a_bfloat16_load_of_the_same_file(tiny_llama_dir, home):
    """A float32 bench with baseline, baseline@bf16 and tr: baseline@bf16's tokens are
    model.generate's on a dense bfloat16 load of the same checkpoint, and (this random model
    being sensitive to rounding) not the float32 baseline's; tr matches the float32 baseline."""
    from tr_cli.bench.methods import make_runners
    from tr_cli.bench.runner import conversation_turns
    from tr_cli.engine.engine import Engine
    from tr_cli.engine.options import DecodingOptions
    from tr_cli.models import Runtime, load_model
    from tr_cli.store.paths import cache_dir
    from tr_cli.text.conversation import ConversationEncoder

    options = DecodingOptions.parse(model=str(tiny_llama_dir), device="cpu", dtype="float32", save=False)
    engine = Engine.open(options)
    methods = parse_methods(["baseline", "baseline@bf16", "tr"], options.drafts, options.k)
    runners, _ = make_runners(engine, methods)
    bf16_model = model_of(engine, methods[1])
    assert next(bf16_model.parameters()).dtype == torch.bfloat16 and bf16_model is not engine.loaded.model
    assert model_of(engine, methods[1]) is bf16_model  # loaded once
    assert variant_loads(engine, methods) == {"bf16": {"dtype": "bfloat16", "weights": "dense", "second_load": True}}

    encode = conversation_turns(ConversationEncoder(engine.loaded.tokenizer))
    prompts = [PromptRecord(str(i), "qa", (text,)) for i, text in enumerate(("Tell me a story.", "Count to ten."))]
    results = run_bench(runners, prompts, encode, decode=str, max_new_tokens=24, turns="1", warmup=0)

    reference = load_model(str(tiny_llama_dir), Runtime(torch.device("cpu"), torch.bfloat16), cache=cache_dir()).model
    for record, result in zip(prompts, results, strict=True):
        ids = torch.tensor([encode([], record.turns[0])])
        out = reference.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, pad_token_id=0
        )
        assert result.methods["baseline@bf16"].tokens == [out[0, ids.shape[1] :].tolist()]
        assert result.identical_to_baseline("tr") and result.identical_to_baseline("baseline@bf16")
    assert any(r.methods["baseline@bf16"].tokens != r.methods["baseline"].tokens for r in results)


def test_a_bench_loaded_dense_bfloat16_runs_bf16_variants_on_its_own_load(tiny_llama_dir, home):
    from tr_cli.engine.engine import Engine
    from tr_cli.engine.options import DecodingOptions

    options = DecodingOptions.parse(model=str(tiny_llama_dir), device="cpu", dtype="bfloat16", weights="dense")
    engine = Engine.open(options, matrix=False, decoder=False)
    methods = parse_methods(["baseline@bf16"], options.drafts, options.k)
    assert model_of(engine, methods[0]) is engine.loaded.model  # no second copy of the same weights
    assert variant_loads(engine, methods) == {"bf16": {"dtype": "bfloat16", "weights": "dense", "second_load": False}}
