"""A decoder layer on tr's kernels as a few calls (models/fused_layers.py, fused_layers.cpp): taken where
it applies (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3), the same function as the model's own modules on
the same quantized weights, each row computed alone, and the direct forward equal to the model's own
(tree == generate: test_native_kernels, test_families)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tr_cli.core.attention import AttentionLayout, causal_visibility
from tr_cli.core.forward import WHOLE_STEP, LlamaFamilyForward, ModelForward
from tr_cli.core.kv_cache import CompactingCache
from tr_cli.models import weights
from tr_cli.models.fused_layers import FusedAttention, FusedMLP, FusedRMSNorm
from tr_cli.models.weights import Q4Linear, quantize
from tr_cli.models.weights_mode import WeightsMode

from tiny_models import ARCHITECTURES, COMMON, random_prompt, tiny_model

pytestmark = pytest.mark.usefixtures("tr_kernels")

FUSED_ARCHS = ("llama", "qwen2", "qwen2-swa", "qwen3", "phi3", "mistral", "gemma2", "gemma3")


def biased_llama() -> torch.nn.Module:
    """Llama with biases on every projection (attention_bias, mlp_bias), which the fused calls add."""
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, attention_bias=True, mlp_bias=True, **COMMON))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.1)
    return model.eval()


def unfused(model: torch.nn.Module, mode: str, monkeypatch) -> torch.nn.Module:
    """`model` quantized as `quantize` does, without the fused layers."""
    with monkeypatch.context() as patch:
        patch.setattr(weights, "fuse_layers", lambda model: 0)
        quantize(model, WeightsMode.parse(mode))
    return model


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_fused_layers_are_taken_where_they_apply(arch):
    model = tiny_model(arch)
    quantize(model, WeightsMode.parse("int4"))
    layers = model.model.layers if hasattr(model, "model") and hasattr(model.model, "layers") else []
    fused = [isinstance(layer.self_attn, FusedAttention) for layer in layers]
    assert all(fused) if arch in FUSED_ARCHS else not any(fused)
    if arch in FUSED_ARCHS:
        layer = layers[0]
        assert isinstance(layer.mlp, FusedMLP) and isinstance(layer.input_layernorm, FusedRMSNorm)
        assert isinstance(model.model.norm, FusedRMSNorm)
    bf16 = tiny_model(arch, dtype=torch.bfloat16)
    quantize(bf16, WeightsMode.parse("int4"))  # torch's kernels: the model's own modules stay
    assert not any(isinstance(module, FusedAttention) for module in bf16.modules())


@pytest.mark.parametrize("mode", ["int4", "int8"])
@pytest.mark.parametrize("arch", [*FUSED_ARCHS, "biased-llama"])
def test_fused_layers_compute_what_the_models_modules_compute(arch, mode, monkeypatch):
    """Same quantized weights, fused or not: the logits agree to float32 rounding. The fused calls
    round differently, and where that moves an activation across half an int8 step a few logits
    move by up to ~1 %; a wrong rotary half, gate/up order or bias would move nearly all of them."""
    build = biased_llama if arch == "biased-llama" else (lambda: tiny_model(arch))
    fused, plain = build(), unfused(build(), mode, monkeypatch)
    quantize(fused, WeightsMode.parse(mode))
    assert isinstance(fused.model.layers[0].self_attn, FusedAttention)
    assert not isinstance(plain.model.layers[0].self_attn, FusedAttention)
    ids = torch.tensor([random_prompt(24, 3)])
    with torch.inference_mode():
        mine, theirs = fused(ids).logits, plain(ids).logits
    assert theirs.abs().max() > 0.1  # the comparison means something
    scale = theirs.abs().max().item()
    differences = (mine - theirs).abs()
    assert differences.median().item() <= 1e-5 * scale
    assert differences.max().item() <= 1e-2 * scale


def test_each_row_of_a_fused_call_is_computed_alone():
    """rms_norm, attention_in (with q/k norms) and gated_mlp (tanh-GELU): a row gives the same bits
    alone or among others."""
    torch.manual_seed(0)
    ops = torch.ops.tr_kernels
    x = torch.randn(1, 7, 96)
    weight = torch.randn(96)
    qkv = Q4Linear.quantized(torch.randn(4 * 16 + 2 * 2 * 16, 96), torch.randn(4 * 16 + 2 * 2 * 16))
    gate_up, down = Q4Linear.quantized(torch.randn(2 * 64, 96), None), Q4Linear.quantized(torch.randn(96, 64), None)
    angles = torch.randn(1, 7, 8).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    together_norm = ops.rms_norm(x, weight, 1e-6)
    norms = torch.randn(16), torch.randn(16), 1e-6  # per-head q/k norms, as Qwen3's and Gemma 3's
    together_in = ops.attention_in(x, *qkv.operands(), cos, sin, 4, 2, *norms)
    together_mlp = ops.gated_mlp(x, *gate_up.operands(), *down.operands(), 1)
    for row in range(7):
        part = slice(row, row + 1)
        assert torch.equal(ops.rms_norm(x[:, part], weight, 1e-6), together_norm[:, part])
        alone = ops.attention_in(x[:, part], *qkv.operands(), cos[:, part], sin[:, part], 4, 2, *norms)
        assert all(torch.equal(a, t[:, :, part]) for a, t in zip(alone, together_in, strict=True))
        mlp = ops.gated_mlp(x[:, part], *gate_up.operands(), *down.operands(), 1)
        assert torch.equal(mlp, together_mlp[:, part])


def test_the_fused_calls_are_the_formulas_they_stand_for():
    """Against the same steps written with torch ops (rotary: transformers' rotate_half form)."""
    torch.manual_seed(0)
    ops = torch.ops.tr_kernels
    x, weight = torch.randn(1, 5, 64), torch.randn(64)
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), expected)
    qkv = Q4Linear.quantized(torch.randn(2 * 16 + 2 * 16, 64), None)
    angles = torch.randn(1, 5, 8).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    q, k, v = ops.attention_in(x, *qkv.operands(), cos, sin, 2, 1)
    y = qkv(x).view(1, 5, 4, 16).transpose(1, 2)

    def rotary(t: torch.Tensor) -> torch.Tensor:
        return t * cos[:, None] + torch.cat([-t[..., 8:], t[..., :8]], dim=-1) * sin[:, None]

    torch.testing.assert_close(q, rotary(y[:, :2]))
    torch.testing.assert_close(k, rotary(y[:, 2:3]))
    assert torch.equal(v, y[:, 3:])
    gate_up, down = Q4Linear.quantized(torch.randn(2 * 32, 64), None), Q4Linear.quantized(torch.randn(64, 32), None)
    gate, up = gate_up(x).split(32, dim=-1)
    silu, gelu = torch.nn.functional.silu(gate), torch.nn.functional.gelu(gate, approximate="tanh")
    torch.testing.assert_close(ops.gated_mlp(x, *gate_up.operands(), *down.operands()), down(silu * up))
    torch.testing.assert_close(ops.gated_mlp(x, *gate_up.operands(), *down.operands(), 1), down(gelu * up))


def test_head_norms_and_partial_rotary_are_the_formulas_they_stand_for():
    """attention_in with Qwen3/Gemma 3's per-head q/k RMS norms (before the rotary embedding), and a
    rotary embedding over the first half of each head only (Phi-3's partial_rotary_factor)."""
    torch.manual_seed(1)
    ops = torch.ops.tr_kernels
    x = torch.randn(1, 5, 64)
    qkv = Q4Linear.quantized(torch.randn(2 * 16 + 2 * 16, 64), None)
    q_norm, k_norm = torch.randn(16), torch.randn(16)
    angles = torch.randn(1, 5, 4).repeat(1, 1, 2)  # 8 of 16 dims rotated
    cos, sin = angles.cos(), angles.sin()
    q, k, v = ops.attention_in(x, *qkv.operands(), cos, sin, 2, 1, q_norm, k_norm, 1e-6)
    y = qkv(x).view(1, 5, 4, 16).transpose(1, 2)

    def normed(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6))

    def rotary(t: torch.Tensor) -> torch.Tensor:
        turned, kept = t[..., :8], t[..., 8:]
        rotated = turned * cos[:, None] + torch.cat([-turned[..., 4:], turned[..., :4]], dim=-1) * sin[:, None]
        return torch.cat([rotated, kept], dim=-1)

    torch.testing.assert_close(q, rotary(normed(y[:, :2], q_norm)))
    torch.testing.assert_close(k, rotary(normed(y[:, 2:3], k_norm)))
    assert torch.equal(v, y[:, 3:])
    with pytest.raises(RuntimeError, match="both or neither"):
        ops.attention_in(x, *qkv.operands(), cos, sin, 2, 1, q_norm, None, 1e-6)
    with pytest.raises(RuntimeError, match="rotary dims"):
        ops.attention_in(x, *qkv.operands(), cos[..., :3], sin[..., :3], 2, 1)


@pytest.mark.parametrize("mask_kind", ["none", "boolean", "additive"])
def test_soft_capped_row_attention_is_gemma2s_eager_attention(mask_kind):
    """Scores scaled, divided by the cap, tanh, times the cap, then masked: transformers' eager
    attention with softcap (Gemma 2), over grouped heads."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    class Attention:
        num_key_value_groups, head_dim, training = 2, 32, False

    torch.manual_seed(2)
    q, k, v = torch.randn(1, 4, 6, 32) * 3, torch.randn(1, 2, 20, 32) * 3, torch.randn(1, 2, 20, 32)
    seen = torch.rand(6, 20) > 0.3
    seen[:, 0] = True
    additive = torch.zeros(1, 1, 6, 20).masked_fill(~seen, torch.finfo(torch.float32).min)
    mask = {"none": None, "boolean": seen[None, None], "additive": additive}[mask_kind]
    got = torch.ops.tr_kernels.row_attention(q, k, v, mask, 0.2, False, 5.0)
    expected, _ = eager_attention_forward(
        Attention(), q, k, v, None if mask is None else additive, scaling=0.2, softcap=5.0
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    uncapped = torch.ops.tr_kernels.row_attention(q, k, v, mask, 0.2, False)
    assert (uncapped - got).abs().max() > 1e-2  # the cap bites on these scores


def test_the_norms_formula_is_read_off_the_module():
    """Llama's RMSNorm scales by its weight, Gemma's by 1 + weight; anything else is not fused."""
    from tr_cli.models.fused_layers import norm_scale

    gemma, llama = tiny_model("gemma3").model.norm, tiny_model("llama").model.norm
    with torch.no_grad():
        gemma.weight.normal_(), llama.weight.normal_()
    assert torch.equal(norm_scale(gemma)[0], 1.0 + gemma.weight) and norm_scale(gemma)[1] == gemma.eps
    assert norm_scale(llama)[0] is not None and torch.equal(norm_scale(llama)[0], llama.weight)
    assert norm_scale(torch.nn.LayerNorm(64)) is None


def test_operands_the_fused_calls_do_not_take_are_refused():
    ops = torch.ops.tr_kernels
    with pytest.raises(RuntimeError, match="one value per feature"):
        ops.rms_norm(torch.randn(2, 64), torch.randn(63), 1e-6)
    with pytest.raises(RuntimeError, match="float32"):
        ops.rms_norm(torch.randn(2, 64).double(), torch.randn(64), 1e-6)
    qkv = Q4Linear.quantized(torch.randn(64, 64), None)
    cos = sin = torch.ones(1, 3, 16)
    with pytest.raises(RuntimeError, match="heads"):
        ops.attention_in(torch.randn(1, 3, 64), *qkv.operands(), cos, sin, 2, 2)  # 64 outputs, 6 heads
    with pytest.raises(RuntimeError, match="cos, sin"):
        ops.attention_in(torch.randn(1, 3, 64), *qkv.operands(), cos[:, :2], sin[:, :2], 2, 1)
    with pytest.raises(RuntimeError, match="kv_heads"):
        ops.attention_in(torch.randn(1, 3, 64), *qkv.operands(), cos, sin, 2, 0)
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(RuntimeError, match="mask"):  # one mask per kv head is not a layout it takes
        ops.row_attention(q, k, k, torch.zeros(1, 2, 3, 5), 0.25, False)


def test_a_stack_given_its_tensors_in_another_order_is_refused():
    model = tiny_model("llama")
    quantize(model, WeightsMode.parse("int4"))
    layer = model.model.layers[0]
    attention = layer.self_attn
    tensors = [attention._qkv[0], None, None, layer.input_layernorm.weight, *attention._qkv[1:]]  # swapped
    tensors += [*attention._o, None, layer.post_attention_layernorm.weight, None, *layer.mlp._operands]
    tensors.append(model.model.norm.weight)
    with pytest.raises(RuntimeError, match="norm"):
        torch.classes.tr_kernels.FusedStack(tensors, [1e-6] * 6, 4, 2, [0], [0], [0.25], [0.0], True)


@pytest.mark.parametrize("one_call", [True, False])
@pytest.mark.parametrize("mode", ["int4", "int8"])
@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_the_direct_forward_equals_the_models_own_on_fused_layers(arch, mode, one_call):
    """Over a prompt that grows the cache past its first buffers and then a 5-token tree step: tr's
    direct path (all layers in one call, masks per layer type where the model has several; or layer
    by layer through the fused attention) against the model's forward through its modules."""
    model = tiny_model(arch)
    quantize(model, WeightsMode.parse(mode))
    direct = LlamaFamilyForward(model)
    assert LlamaFamilyForward.supports(model) and direct.whole_step is getattr(model, WHOLE_STEP)
    if not one_call:
        direct.whole_step = None
    own = ModelForward(model, "cache")
    layout = AttentionLayout.from_config(model.config, torch.float32, "cpu")
    prompt = 300  # past the cache's first 256 rows
    ids = torch.tensor(random_prompt(prompt + 5, 5))
    results = []
    for forward in (direct, own):
        cache = CompactingCache()
        positions = torch.arange(prompt)
        with torch.inference_mode():
            visible = causal_visibility(prompt, "cpu")
            first = forward(ids[:prompt], positions, layout.build(0, positions, visible), cache)
            positions = torch.tensor([0, 1, 1, 2, 3]) + prompt
            rows = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
            second = forward(ids[prompt:], positions, layout.build(prompt, positions, torch.tensor(rows).bool()), cache)
        results.append((first, second, cache.length, *[layer.keys.clone() for layer in cache.layers]))
    mine, theirs = results
    assert mine[2] == theirs[2] == prompt + 5
    assert all(torch.equal(a, b) for a, b in zip(mine[:2] + mine[3:], theirs[:2] + theirs[3:], strict=True))
