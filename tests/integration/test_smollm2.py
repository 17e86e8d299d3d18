"""The packaged SmolLM2-135M-Instruct (real weights, GGUF) in float32: Token Recycling output is
token-for-token what `model.generate` gives, on bundled Spec-Bench prompts and a second turn."""

from pathlib import Path

import torch

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.text.conversation import encode_prompt
from tr_cli.text.prompts import read_prompt_file

NEW_TOKENS = 48


def greedy(loaded, ids: list[int], max_new_tokens: int) -> list[int]:
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        out = loaded.model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=loaded.eos_token_ids[0],
        )
    return out[0, len(ids) :].tolist()


def test_packaged_model_loads_as_expected(smollm2_fp32):
    assert smollm2_fp32.model.config.model_type == "llama"
    assert smollm2_fp32.runtime.dtype == torch.float32
    assert smollm2_fp32.model.get_output_embeddings().weight.shape[0] == 49152
    assert smollm2_fp32.eos_token_ids == [2]
    assert "<|im_start|>" in smollm2_fp32.tokenizer.decode(encode_prompt(smollm2_fp32.tokenizer, "hi"))


def test_smollm2_matches_generate_on_spec_bench_prompts(smollm2_fp32):
    loaded = smollm2_fp32
    prompts = {p.category: p for p in read_prompt_file(Path(__file__).parents[1] / "data" / "spec_bench_sample.jsonl")}
    decoder = TokenRecyclingDecoder(loaded.model)  # warm matrix across prompts
    accepted_drafts = 0
    # Two categories here, two others in the kernels' test below: each prompt costs ~20 s on 2 cores.
    for category in ("qa", "translation"):
        ids = encode_prompt(loaded.tokenizer, prompts[category].turns[0])
        decoder.reset()
        result = decoder.generate(ids, StopCondition.build(NEW_TOKENS, loaded.eos_token_ids))
        assert result.tokens == greedy(loaded, ids, NEW_TOKENS), category
        accepted_drafts += result.stats.step_tokens - result.stats.steps
    assert accepted_drafts > 0


def test_smollm2_second_turn_from_cache(smollm2_fp32):
    loaded = smollm2_fp32
    tokenizer = loaded.tokenizer
    first = encode_prompt(tokenizer, "Name three primary colors.")
    decoder = TokenRecyclingDecoder(loaded.model)
    reply = decoder.generate(first, StopCondition.build(24, loaded.eos_token_ids)).tokens
    follow_up = tokenizer.encode("\n<|im_start|>user\nAnd three secondary ones?<|im_end|>\n<|im_start|>assistant\n")
    second = decoder.generate(follow_up, StopCondition.build(24, loaded.eos_token_ids)).tokens
    assert second == greedy(loaded, first + reply + follow_up, 24)


def test_smollm2_on_tr_kernels_matches_generate_with_trees(smollm2_fp32, tr_kernels):
    """The default on an AVX2 CPU: the packaged Q4_1 weights as int4 on tr's kernels, activations
    rounded to int8, tr's row attention. Tree steps (the paper's 80 nodes, so several rows every
    step) give generate's tokens on the same model, on real prompts, where SDPA's one-vs-many-query
    differences used to move the int8 roundings and part them at near-ties."""
    from tr_cli.core.tree import PRESETS
    from tr_cli.models.weights import quantized_copy, weights_mode
    from tr_cli.models.weights_mode import WeightsMode

    int4 = quantized_copy(smollm2_fp32.model, WeightsMode.parse("int4")).eval()
    assert weights_mode(int4).name == "int4" and int4.config._attn_implementation == "tr_rows"
    loaded = type(smollm2_fp32)(int4, smollm2_fp32.tokenizer, smollm2_fp32.source, smollm2_fp32.runtime)
    prompts = {p.category: p for p in read_prompt_file(Path(__file__).parents[1] / "data" / "spec_bench_sample.jsonl")}
    decoder = TokenRecyclingDecoder(int4, tree=PRESETS["paper"])
    assert decoder.forward_pass.name == "direct"
    for category in ("writing", "math_reasoning"):
        ids = encode_prompt(loaded.tokenizer, prompts[category].turns[0])
        decoder.reset()
        result = decoder.generate(ids, StopCondition.build(NEW_TOKENS, loaded.eos_token_ids))
        assert result.tokens == greedy(loaded, ids, NEW_TOKENS), category
        assert result.stats.steps < len(result.tokens)  # drafts were accepted
