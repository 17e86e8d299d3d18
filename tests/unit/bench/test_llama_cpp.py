"""llama.cpp as a bench method: named like the others, never compared with our weights' tokens, and
(where llama-cpp-python is installed) run for real on the packaged GGUF."""

import importlib.util

import pytest

from tr_cli.bench.llama_cpp import server_binary
from tr_cli.bench.methods import counterpart, parse_methods
from tr_cli.bench.metrics import summarize
from tr_cli.bench.report import rows
from tr_cli.bench.run import Run
from tr_cli.bench.runner import run_bench
from tr_cli.core.drafters import DraftPlan
from tr_cli.errors import SettingError
from tr_cli.text.prompts import PromptRecord

INSTALLED = importlib.util.find_spec("llama_cpp") is not None


def test_its_tokens_are_its_own():
    """Other kernels on other weights: no identical count, no speedup over our `ar`, but its
    speedup over transformers like any method's."""
    assert counterpart("llama.cpp", "baseline") is None and counterpart("llama.cpp", "ar") is None

    def answer(tokens, seconds):
        return lambda ids, max_new_tokens, grammar: Run(tokens[:max_new_tokens], seconds, len(tokens) - 1)

    runners = {
        "baseline": answer([1, 2, 3, 4], 2.0),
        "ar": answer([1, 2, 3, 4], 1.0),
        "llama.cpp": answer([1, 2, 3, 4], 0.5),  # the same tokens: still not "identical" to ours
    }
    results = run_bench(runners, [PromptRecord("a", "qa", ("x",))], lambda h, t: [0], str, 10, warmup=0)
    report = summarize(results, {"model": "fake"})
    llama = report["methods"]["llama.cpp"]
    assert llama["speedup"] == 4.0 and llama["speedup_vs_ar"] is None
    assert llama["identical_to_baseline"] is None and report["methods"]["ar"]["identical_to_baseline"] == 1
    assert report["prompts"][0]["llama.cpp"]["identical_to_baseline"] is None
    header, body = rows(report)
    assert body[-1][0] == "llama.cpp" and body[-1][-1] == "–"


@pytest.mark.skipif(INSTALLED, reason="llama-cpp-python is installed here")
def test_missing_llama_cpp_is_said_before_anything_loads():
    with pytest.raises(SettingError, match=r"needs llama-cpp-python.*tr-cli\[llamacpp\]") as caught:
        parse_methods(["tr", "llama.cpp"], DraftPlan.of(), 8)
    assert caught.value.setting == "methods"


def test_llama_cpp_takes_no_weights_variant():
    with pytest.raises(SettingError, match="llama.cpp runs the GGUF file on its own kernels; it takes no @variant"):
        parse_methods(["llama.cpp@int4"], DraftPlan.of(), 8)


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason="llama-cpp-python is not installed (the optional extra)")
def test_llama_cpp_runs_the_packaged_gguf_on_our_token_ids(smollm2_fp32):
    """The same ids mean the same text to llama.cpp: its greedy reply is deterministic, cut at the
    budget, and each of its first tokens is among our float32 model's top 5 after the same
    context (its Q4_1 kernels round differently: on this prompt it opens with "L'Étoile" where
    ours says "The capital", a near tie, so the words are not compared)."""
    import torch

    from tr_cli.bench.llama_cpp import LlamaCpp, llama_cpp_version
    from tr_cli.text.conversation import ConversationEncoder

    loaded = smollm2_fp32
    ids = (
        ConversationEncoder(loaded.tokenizer)
        .encode([{"role": "user", "content": "What is the capital of France?"}])
        .ids
    )
    llama = LlamaCpp(loaded.source.path, loaded.eos_token_ids, 2048)
    first, again = llama.run(ids, 24), llama.run(ids, 24)
    assert first.tokens == again.tokens and 0 < len(first.tokens) <= 24
    assert first.steps == len(first.tokens) - 1 and first.seconds > 0
    with torch.no_grad():
        logits = loaded.model(torch.tensor([ids + first.tokens[:4]])).logits[0]
    for offset, token in enumerate(first.tokens[:4]):
        assert token in logits[len(ids) - 1 + offset].topk(5).indices.tolist()
    assert len(llama.run(ids, 3).tokens) == 3
    assert llama_cpp_version(["llama.cpp"]).startswith("llama-cpp-python ")


SERVER = server_binary()


@pytest.mark.skipif(SERVER is not None, reason="llama-server is installed here")
def test_missing_llama_server_is_said_before_anything_loads():
    with pytest.raises(SettingError, match=r"needs llama-server .*TR_LLAMA_SERVER") as caught:
        parse_methods(["llama.cpp+ngram"], DraftPlan.of(), 8)
    assert caught.value.setting == "methods"
    assert counterpart("llama.cpp+ngram", "baseline") is None


@pytest.mark.slow
@pytest.mark.skipif(SERVER is None, reason="llama-server is not installed (set TR_LLAMA_SERVER)")
def test_llama_server_with_ngram_speculation_answers_our_ids(smollm2_fp32):
    """llama.cpp's own draftless speculation, as a server on loopback: greedy, so its reply is
    the same each time; it stops at the budget, counts at most one forward per token after the
    first, and the server is gone after close."""
    from tr_cli.bench.llama_cpp import LlamaServer
    from tr_cli.text.conversation import ConversationEncoder

    loaded = smollm2_fp32
    text = "Repeat exactly, twice: the quick brown fox jumps over the lazy dog. " * 3
    ids = ConversationEncoder(loaded.tokenizer).encode([{"role": "user", "content": text}]).ids
    server = LlamaServer(loaded.source.path, loaded.eos_token_ids, 2048)
    try:
        first, again = server.run(ids, 48), server.run(ids, 48)
        assert first.tokens == again.tokens and 0 < len(first.tokens) <= 48
        assert 0 < first.steps <= len(first.tokens) - 1
        assert len(server.run(ids, 3).tokens) <= 3
    finally:
        server.close()
    assert server.process.poll() is not None
