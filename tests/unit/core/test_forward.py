"""The direct forward (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3) gives the model's own forward's logits
and cache, bit for bit."""

import pytest
import torch

from tr_cli.core.attention import AttentionLayout, causal_visibility
from tr_cli.core.decode import TokenRecyclingDecoder
from tr_cli.core.forward import LlamaFamilyForward, ModelForward, grouped_sdpa, make_forward, shares_kv_heads
from tr_cli.core.kv_cache import CompactingCache
from tr_cli.models import WeightsMode
from tr_cli.models.weights import quantize

from tiny_models import ARCHITECTURES, random_prompt, tiny_model

DIRECT = ["llama", "qwen2", "qwen2-swa", "qwen3", "phi3", "mistral", "gemma2", "gemma3"]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_direct_path_is_taken_for_its_families_only(arch):
    decoder = TokenRecyclingDecoder(tiny_model(arch))
    expected = LlamaFamilyForward if arch in DIRECT else ModelForward
    assert type(decoder.forward_pass) is expected


def _tree_visibility(size: int) -> torch.Tensor:
    """A small tree: node i's parent is (i - 1) // 2, so siblings must not see each other."""
    visible = torch.eye(size, dtype=torch.bool)
    for node in range(1, size):
        parent = (node - 1) // 2
        visible[node] |= visible[parent]
    return visible


def _depths(size: int) -> torch.Tensor:
    return torch.tensor([(node + 1).bit_length() - 1 for node in range(size)])


def _run(forward, model, ids: list[int], tree: list[int]) -> tuple[list[torch.Tensor], CompactingCache]:
    """A chunked prefill, a tree step, then one token: the logits of each and the cache."""
    layout = AttentionLayout.from_config(model.config, next(model.parameters()).dtype, "cpu")
    cache = CompactingCache()
    outputs = []
    for chunk in (ids[:13], ids[13:]):
        positions = torch.arange(len(chunk)) + cache.length
        mask = layout.build(cache.length, positions, causal_visibility(len(chunk), "cpu"))
        outputs.append(forward(torch.tensor(chunk), positions, mask, cache))
    positions = _depths(len(tree)) + cache.length
    outputs.append(
        forward(torch.tensor(tree), positions, layout.build(cache.length, positions, _tree_visibility(7)), cache)
    )
    cache.keep(len(ids), torch.tensor([0, 2, 6]))  # accept a path, as a step does
    positions = torch.arange(1) + cache.length
    outputs.append(
        forward(
            torch.tensor(tree[:1]), positions, layout.build(cache.length, positions, causal_visibility(1, "cpu")), cache
        )
    )
    return outputs, cache


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8", "int4", "int4+bf16"])
@pytest.mark.parametrize("arch", DIRECT)
def test_direct_logits_and_cache_equal_the_models_own(arch, weights):
    dtype = torch.float32 if weights == "float32" else torch.bfloat16
    model = tiny_model(arch, dtype=dtype)
    if weights.startswith("int"):  # the direct path then runs the fused q/k/v and gate/up layers
        quantize(model, WeightsMode.parse(weights))
        mlp = model.model.layers[0].mlp
        assert hasattr(mlp, "fused_gate_up") or type(mlp.gate_up_proj).__name__ != "Linear"  # Phi-3: its own
    ids, tree = random_prompt(30, 1), random_prompt(7, 2)  # 30 > the sliding window of 12
    with torch.inference_mode():
        own, own_cache = _run(ModelForward(model, "cache"), model, ids, tree)
        direct, direct_cache = _run(make_forward(model, "cache"), model, ids, tree)
    assert isinstance(make_forward(model, "cache"), LlamaFamilyForward)
    for a, b in zip(own, direct, strict=True):
        assert torch.equal(a, b)
    assert own_cache.length == direct_cache.length == 30 + 3 + 1
    for a, b in zip(own_cache.layers, direct_cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_model_split_over_devices_takes_its_own_forward():
    model = tiny_model("llama")
    model.hf_device_map = {"model.layers.0": 0, "model.layers.1": 1}
    assert not LlamaFamilyForward.supports(model)
    model.hf_device_map = {"": 0}
    assert LlamaFamilyForward.supports(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_attention_is_transformers_sdpa_attention_bit_for_bit(dtype):
    """Key/value heads read through stride-0 views instead of `repeat_kv` copies: the same numbers,
    over a slice of a larger cache buffer as our cache hands out, for tree-step and prefill sizes."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Attention:
        num_key_value_groups, is_causal = 3, True

    torch.manual_seed(0)
    buffer = torch.randn(2, 1, 3, 600, 64, dtype=dtype)  # (keys/values, batch, heads, capacity, dim)
    for count, length in ((2, 40), (3, 300), (7, 301), (129, 500)):
        query = torch.randn(1, count, 9, 64, dtype=dtype).transpose(1, 2)
        key, value = buffer[0, :, :, :length], buffer[1, :, :, :length]
        mask = torch.zeros(1, 1, count, length, dtype=dtype)
        mask[..., -count:] = torch.full((count, count), float("-inf")).triu(1)
        mask[..., 5] = float("-inf")  # a hidden sibling, say
        assert shares_kv_heads(query, key, mask)
        expected, _ = sdpa_attention_forward(Attention(), query, key, value, mask, scaling=0.125)
        assert torch.equal(grouped_sdpa(query, key, value, mask, 0.125), expected)
    assert not shares_kv_heads(query, torch.randn(1, 9, 10, 64), mask)  # one key head per query head
    assert not shares_kv_heads(query, key, {"full_attention": mask})


@pytest.mark.parametrize(
    ("arch", "weights"), [(arch, "float32") for arch in ARCHITECTURES] + [(arch, "int4") for arch in DIRECT]
)
def test_last_only_gives_the_last_rows_logits_and_the_same_cache(arch, weights, request):
    """A prefill that nothing learns from needs the head on its last row only (the head over 200
    prompt rows was a quarter of a SmolLM2 prefill): that row's logits, as transformers computes
    them with logits_to_keep=1 (generate's prefill), and the same cache as a full forward."""
    model = tiny_model(arch)
    if weights == "int4":  # float32 int4: tr's kernels, the fused layers and the whole-step kernel
        request.getfixturevalue("tr_kernels")
        quantize(model, WeightsMode.parse(weights))
    layout = AttentionLayout.from_config(model.config, torch.float32, "cpu")
    ids = torch.tensor(random_prompt(30, 3))
    positions = torch.arange(len(ids))
    mask = layout.build(0, positions, causal_visibility(len(ids), "cpu"))
    caches = [CompactingCache() for _ in range(3)]
    with torch.inference_mode():
        full = make_forward(model, "cache")(ids, positions, mask, caches[0])
        last = make_forward(model, "cache")(ids, positions, mask, caches[1], last_only=True)
        own = ModelForward(model, "cache")(ids, positions, mask, caches[2], last_only=True)
    assert ModelForward(model, "cache")._keeps_logits
    assert full.shape[0] == len(ids) and last.shape == own.shape == (1, full.shape[1])
    assert torch.equal(last, own)
    if weights == "int4":  # tr's kernels compute every row alone, whatever the other rows
        assert torch.equal(last[0], full[-1])
    else:  # BLAS may round one row through the head differently from the same row among thirty
        torch.testing.assert_close(last[0], full[-1], rtol=1e-5, atol=1e-5)
    for cache in caches[1:]:
        for a, b in zip(caches[0].layers, cache.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
