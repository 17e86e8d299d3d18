"""Weight-only int8/int4 layers (`--weights`): what they compute, what they replace, what they refuse."""

import copy

import pytest
import torch
from torch import nn

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.core.decode import prefill_chunks
from tr_cli.core.matrix import output_vocab_size
from tr_cli.core.step_scope import decoding_step, in_decoding_step
from tr_cli.core.tree import PRESETS
from tr_cli.engine.calibration import calibration_key, model_shape
from tr_cli.errors import SettingError
from tr_cli.models import Runtime, WeightsMode, native_kernels
from tr_cli.models.runtime import TORCH_KERNELS_WHERE_TRS_RUN
from tr_cli.models.weights import (
    INT4_GROUP,
    Int4Linear,
    Int8Linear,
    Q4Linear,
    Q8Linear,
    quantize,
    quantized_copy,
    weights_mode,
)

from tiny_models import EOS, random_prompt, reference, tiny_model

CPU = torch.device("cpu")


def _int8_reference(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric per-row int8, written out independently of the module."""
    scale = weight.abs().amax(dim=1, keepdim=True) / 127
    return (weight / scale).round().clamp(-127, 127) * scale.bfloat16().float()


def _int4_reference(weight: torch.Tensor) -> torch.Tensor:
    """Q4_1-style groups of 32 (scale and minimum per group), written out independently."""
    rows, cols = weight.shape
    groups = weight.reshape(rows, cols // INT4_GROUP, INT4_GROUP)
    low = groups.amin(dim=-1, keepdim=True)
    scale = (groups.amax(dim=-1, keepdim=True) - low) / 15
    levels = ((groups - low) / scale).round().clamp(0, 15)
    zero = (low + 8 * scale).bfloat16().float()
    return ((levels - 8) * scale.bfloat16().float() + zero).reshape(rows, cols)


@pytest.mark.parametrize(("kind", "dequantize"), [(Int8Linear, _int8_reference), (Int4Linear, _int4_reference)])
def test_layer_computes_x_times_its_dequantized_weight(kind, dequantize):
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 96) * 0.05, torch.randn(48)
    x = torch.randn(2, 5, 96).bfloat16()
    layer = kind.quantized(weight, bias)
    expected = x.float() @ dequantize(weight).t() + bias.bfloat16().float()
    out = layer(x)
    assert out.shape == (2, 5, 48) and out.dtype == torch.bfloat16
    # bf16 output rounding only: a wrong scale, zero or group layout is off by far more.
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    # and the quantization itself stays within half a step of the dense weight
    dense = x.float() @ weight.t() + bias
    assert (out.float() - dense).abs().max() < 0.25


def test_int4_groups_follow_the_weight_not_a_global_scale():
    """A group of tiny weights next to a group of large ones keeps its own precision."""
    weight = torch.zeros(16, 64)
    weight[:, :32] = torch.linspace(-1e-3, 1e-3, 32)
    weight[:, 32:] = torch.linspace(-10, 10, 32)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    x[0, :32] = 1
    out = Int4Linear.quantized(weight, None)(x).float()
    assert out.abs().max() < 1e-2  # sum of the small group (≈0), not a 10/15 quantization step


def test_quantize_replaces_every_matmul_and_the_head():
    model = tiny_model("llama", dtype=torch.bfloat16)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    embedding = model.get_input_embeddings().weight.clone()
    done = quantize(model, WeightsMode.parse("int8"))
    assert (done.layers, done.kept_dense) == (linears, 0)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.get_output_embeddings(), Int8Linear)
    assert torch.equal(model.get_input_embeddings().weight, embedding)
    assert output_vocab_size(model) == model.config.vocab_size
    assert weights_mode(model).name == "int8"


class _Attention(nn.Module):
    """q/k/v projections with biases, as a Llama-family layer names them."""

    def __init__(self, sizes: tuple[int, int, int]) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(64, size) for size in sizes)


def _int4_packing_keeps_rows_apart() -> bool:
    """Whether this CPU's int4 packing holds rows 64..96 of a weight exactly as packing those rows
    alone does: torch's AVX-512 packing interleaves blocks of 64 rows, its AVX2 packing does not."""
    weight = torch.randn(128, 64, generator=torch.Generator().manual_seed(1))
    whole = Int4Linear.quantized(weight, None).weight_int4[64:96]
    return torch.equal(whole, Int4Linear.quantized(weight[64:96], None).weight_int4)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_fused_siblings_are_row_views_computing_what_separate_layers_compute(mode):
    """q/k/v are quantized as one layer; each sibling is a view of its rows and computes bit for
    bit what the sibling quantized on its own computes. Where torch's int4 packing would mix two
    siblings' rows (on AVX-512 it interleaves blocks of 64 rows), they stay separate layers."""
    torch.manual_seed(0)
    x = torch.randn(3, 64).bfloat16()
    row_views_exact = mode == "int8" or _int4_packing_keeps_rows_apart()
    for sizes, fuses in (((128, 64, 64), True), ((64, 32, 32), row_views_exact)):
        model = _Attention(sizes).bfloat16()
        alone = {}
        for name in ("q_proj", "k_proj", "v_proj"):
            holder = nn.Sequential(copy.deepcopy(getattr(model, name)))
            quantize(holder, WeightsMode.parse(mode))
            alone[name] = holder[0]
        assert quantize(model, WeightsMode.parse(mode)).layers == 3
        assert hasattr(model, "fused_qkv") == fuses
        pieces = []
        for name in ("q_proj", "k_proj", "v_proj"):
            layer = getattr(model, name)
            assert torch.equal(layer(x), alone[name](x))
            pieces.append(layer(x))
            if fuses:
                storage = (
                    model.fused_qkv.weight_int8 if mode == "int8" else model.fused_qkv.weight_int4
                ).untyped_storage()
                weight = layer.weight_int8 if mode == "int8" else layer.weight_int4
                assert weight.untyped_storage().data_ptr() == storage.data_ptr()  # a view, no copy
        if fuses:
            assert torch.equal(model.fused_qkv(x), torch.cat(pieces, dim=-1))


def test_int4_keeps_the_output_head_at_int8():
    model = tiny_model("llama", dtype=torch.bfloat16)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert quantize(model, WeightsMode.parse("int4")).layers == linears
    assert type(model.get_output_embeddings()) is Int8Linear
    assert type(model.model.layers[0].mlp.down_proj) is Int4Linear
    assert weights_mode(model).name == "int4"


def test_gpt2_conv1d_layers_are_quantized_too():
    model = tiny_model("gpt2", dtype=torch.bfloat16)
    assert quantize(model, WeightsMode.parse("int4")).kept_dense == 0
    assert type(model.transformer.h[0].attn.c_attn) is Int4Linear


def test_int4_keeps_layers_the_kernel_cannot_take_dense():
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 8), nn.Linear(40, 16)).bfloat16()
    done = quantize(model, WeightsMode.parse("int4"))
    assert (done.layers, done.kept_dense) == (1, 2)  # out 8 is not a multiple of 16; in 40 not of 32
    assert isinstance(model[0], Int4Linear) and isinstance(model[1], nn.Linear)


def test_int8_on_torch_kernels_keeps_layers_of_rows_not_in_16_byte_vectors_dense():
    """torch's int8 kernel reads weight rows with 16-byte aligned loads: 40 inputs gave wrong
    numbers at every row count (and SIGSEGV at some), so such a layer stays dense."""
    model = nn.Sequential(nn.Linear(48, 32), nn.Linear(32, 40), nn.Linear(40, 16)).bfloat16()
    dense = copy.deepcopy(model)
    done = quantize(model, WeightsMode.parse("int8"))
    assert (done.layers, done.kept_dense) == (2, 1)
    assert isinstance(model[0], Int8Linear) and isinstance(model[1], Int8Linear) and type(model[2]) is nn.Linear
    for rows in (1, 3, 4, 7):
        x = torch.randn(rows, 48).bfloat16()
        with torch.inference_mode():
            got, want = model(x).float(), dense(x).float()
        assert (got - want).abs().max() <= 0.05 * want.abs().max() + 0.05, rows


def test_quantized_copy_shares_what_it_keeps_and_leaves_the_original_dense():
    model = tiny_model("llama", dtype=torch.bfloat16)
    ids = torch.tensor([random_prompt(12, 0)])
    before = model(ids).logits
    twin = quantized_copy(model, WeightsMode.parse("int8"))
    assert weights_mode(model).name == "dense" and weights_mode(twin).name == "int8"
    assert torch.equal(model(ids).logits, before)
    assert twin.get_input_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert not torch.equal(twin(ids).logits, before)  # it does run other weights


def test_quantized_copy_refuses_a_float16_model():
    with pytest.raises(SettingError, match=r"float32 \(tr's kernels\) or bfloat16 models"):
        quantized_copy(tiny_model("llama", dtype=torch.float16), WeightsMode.parse("int8"))


def test_a_float32_model_is_quantized_onto_tr_kernels(tr_kernels):
    model = tiny_model("llama")
    twin = quantized_copy(model, WeightsMode.parse("int4"))
    assert type(twin.model.layers[0].mlp.down_proj) is Q4Linear and type(twin.get_output_embeddings()) is Q8Linear
    assert twin.get_input_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    with pytest.raises(SettingError, match="keeps bfloat16 prompt weights"):
        quantized_copy(model, WeightsMode.parse("int4+bf16"))


@pytest.mark.parametrize("mode", ["int8+bf16", "int4+bf16"])
def test_bf16_modes_run_prompts_on_the_bf16_weights_and_tokens_on_the_quantized_ones(mode):
    """One row: what the plain quantized layer computes. Several rows: x Wᵀ + b with the model's
    own bfloat16 weight (a prompt), unless they are a decoding step's, each row then what it
    gives alone on the quantized weights."""
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(64, 32)).bfloat16()
    plain, fast = copy.deepcopy(dense), copy.deepcopy(dense)
    quantize(plain, WeightsMode.parse(mode.removesuffix("+bf16")))
    quantize(fast, WeightsMode.parse(mode))
    assert plain[0].prompt_weight is None
    assert torch.equal(fast[0].prompt_weight, dense[0].weight)
    x = torch.randn(7, 64).bfloat16()
    assert torch.equal(fast(x[:1]), plain(x[:1]))
    assert torch.equal(fast(x), torch.nn.functional.linear(x, dense[0].weight, dense[0].bias))
    assert not torch.equal(fast(x), plain(x))
    with decoding_step():
        step = fast(x)
        assert in_decoding_step()
    assert not in_decoding_step()
    assert torch.equal(step, plain(x))
    assert torch.equal(step, torch.cat([fast(row[None]) for row in x]))
    assert weights_mode(fast).name == mode and weights_mode(plain).name == mode.removesuffix("+bf16")


def test_a_bf16_mode_head_gives_the_prompts_last_row_as_generate_computes_it():
    """`generate` asks the head for a prompt's last position only: one row, so quantized. The
    head computes that row so too; the other rows (they seed the matrix) on the bf16 weight."""
    model = tiny_model("llama", dtype=torch.bfloat16)
    plain, fast = (
        quantized_copy(model, WeightsMode.parse("int4")),
        quantized_copy(model, WeightsMode.parse("int4+bf16")),
    )
    dense_head, head, quantized_head = model.lm_head, fast.lm_head, plain.lm_head
    assert head.head and not fast.model.layers[0].mlp.down_proj.head
    x = torch.randn(6, model.config.hidden_size).bfloat16()
    out = head(x)
    assert torch.equal(out[:-1], torch.nn.functional.linear(x[:-1], dense_head.weight))
    assert torch.equal(out[-1:], quantized_head(x[-1:])) and torch.equal(out[-1:], head(x[-1:]))


def test_a_bf16_mode_computes_a_prompt_as_the_dense_model_and_keeps_float32_buffers():
    """Quantizing leaves the rest of the model as loaded: transformers keeps the rotary
    frequencies in float32 in a bfloat16 model (casting them changed every attention score).
    So a prompt's logits (but the last row's, see above) are the dense model's, bit for bit."""
    model = tiny_model("llama", dtype=torch.bfloat16)
    rotary = model.model.rotary_emb
    rotary.inv_freq = rotary.inv_freq.float()  # as from_pretrained leaves it
    twin = quantized_copy(model, WeightsMode.parse("int4+bf16"))
    assert twin.model.rotary_emb.inv_freq.dtype == torch.float32
    ids = torch.tensor([random_prompt(24, 3)])
    with torch.inference_mode():
        assert torch.equal(twin(ids).logits[0, :-1], model(ids).logits[0, :-1])


def test_bf16_prompt_weights_are_shared_with_the_dense_model_and_viewed_by_fused_siblings():
    model = tiny_model("llama", dtype=torch.bfloat16)
    twin = quantized_copy(model, WeightsMode.parse("int4+bf16"))
    dense_mlp, mlp = model.model.layers[0].mlp, twin.model.layers[0].mlp
    assert mlp.down_proj.prompt_weight.data_ptr() == dense_mlp.down_proj.weight.data_ptr()  # no copy
    fused = mlp.fused_gate_up.prompt_weight
    assert mlp.up_proj.prompt_weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert torch.equal(fused, torch.cat([dense_mlp.gate_proj.weight, dense_mlp.up_proj.weight]))
    x = torch.randn(5, model.config.hidden_size).bfloat16()
    assert torch.equal(mlp.fused_gate_up(x), torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1))


def test_the_decoder_runs_prompts_as_prompts_and_its_steps_as_decoding_steps():
    """What a `+bf16` model needs from the decoder: its prefill outside decoding_step, every
    drafted step (and the t(N) calibration's) inside."""
    model = tiny_model("llama", dtype=torch.bfloat16)
    quantize(model, WeightsMode.parse("int4+bf16"))
    calls: list[tuple[int, bool]] = []
    layer = model.model.layers[0].mlp.down_proj
    handle = layer.register_forward_pre_hook(lambda _, args: calls.append((args[0].shape[1], in_decoding_step())))
    decoder = TokenRecyclingDecoder(model, tree=PRESETS["paper"])
    decoder.generate(random_prompt(30, 0), StopCondition.build(12, [EOS]))
    assert calls[0] == (30, False)  # the prompt
    assert len(calls) > 1 and all(in_step and rows > 1 for rows, in_step in calls[1:])  # 80-node tree steps
    calls.clear()
    decoder.measure_cost(sizes=(1, 4), context=16, repeats=1)
    assert calls[0] == (16, False) and {in_step for _, in_step in calls[1:]} == {True}
    handle.remove()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["int8", "int4", "int4+bf16"])
def test_one_token_decoding_equals_generate_on_the_quantized_model(arch, mode):
    """tr's own forward (no drafts) through the quantized layers, its cache and masks, gives
    `generate`'s tokens on the same quantized model (with `+bf16`, the prompt runs on the
    bfloat16 weights in both)."""
    model = tiny_model(arch, dtype=torch.bfloat16)
    quantize(model, WeightsMode.parse(mode))
    decoder = TokenRecyclingDecoder(model, tree=PRESETS["none"])
    for seed, (length, budget) in enumerate([(5, 1), (9, 7), (20, 40), (150, 12)]):
        ids = random_prompt(length, seed)
        decoder.reset()
        assert decoder.generate(ids, StopCondition.build(budget, [EOS])).tokens == reference(model, ids, budget)


def test_runtime_refuses_weights_that_cannot_run():
    assert Runtime.resolve("cpu", "float16", "dense").dtype == torch.float16  # dense runs in any dtype
    torch_kernels = "torch's kernels" if native_kernels.unavailable() else TORCH_KERNELS_WHERE_TRS_RUN
    on_torch = Runtime(CPU, torch.bfloat16, WeightsMode("int8"), kernels=torch_kernels)
    assert Runtime.resolve("cpu", "bfloat16", "int8") == on_torch
    assert Runtime.resolve("cpu", "bfloat16", "int4").weights.name == "int4"
    assert Runtime.resolve("cpu", "auto", "int4+bf16").weights == WeightsMode("int4", bf16_prompts=True)
    assert Runtime.resolve("cpu", "auto", "int4+bf16").dtype == torch.bfloat16
    with pytest.raises(SettingError, match="weights int3: unknown; use auto, dense, int8, int4"):
        Runtime.resolve("cpu", "auto", "int3")
    with pytest.raises(SettingError, match="weights int4: computes in float32 .* or bfloat16"):
        Runtime.resolve("cpu", "float16", "int4")


def test_runtime_picks_tr_kernels_where_they_can_run(monkeypatch):
    from tr_cli.models import native_kernels

    if native_kernels.unavailable() is not None:
        pytest.skip(f"tr's kernels cannot run here: {native_kernels.unavailable()}")
    assert Runtime.resolve("cpu", "auto", "int8") == Runtime(
        CPU, torch.float32, WeightsMode("int8"), kernels="tr's kernels"
    )
    assert Runtime.resolve("cpu", "float32", "int4").describe() == "int4 weights, float32 on tr's kernels"
    monkeypatch.setenv("TR_KERNELS", "torch")  # where they cannot run: torch's, saying why
    fallback = Runtime.resolve("cpu", "auto", "int4")
    assert fallback.dtype == torch.bfloat16
    assert fallback.describe() == "int4 weights, bfloat16 on torch's kernels: tr's cannot run here, TR_KERNELS=torch"
    with pytest.raises(SettingError, match="computes in float32 on tr's kernels, which cannot run here: TR_KERNELS"):
        Runtime.resolve("cpu", "float32", "int4")


def test_calibration_key_tells_weights_apart_and_keeps_dense_keys():
    dense = tiny_model("llama", dtype=torch.bfloat16)
    assert "weights" not in model_shape(dense)  # dense models keep the keys cached before --weights
    int8 = quantized_copy(dense, WeightsMode.parse("int8"))
    int4 = quantized_copy(dense, WeightsMode.parse("int4"))
    fast = quantized_copy(dense, WeightsMode.parse("int4+bf16"))
    keys = {calibration_key(m, CPU, torch.bfloat16, 8) for m in (dense, int8, int4, fast)}
    assert len(keys) == 4


def test_a_long_prompt_is_prefilled_in_even_chunks():
    """No one-token last chunk, so a `+bf16` model prefills every chunk of a long prompt on the
    bfloat16 weights, as `generate`'s one call does; and the chunks cover the prompt exactly."""
    assert prefill_chunks(0) == [] and prefill_chunks(7) == [(0, 7)] and prefill_chunks(512) == [(0, 512)]
    for length in (513, 530, 1100, 4097):
        spans = prefill_chunks(length)
        assert spans[0][0] == 0 and spans[-1][1] == length
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        sizes = [stop - start for start, stop in spans]
        assert max(sizes) <= 512 and max(sizes) - min(sizes) <= 1 and min(sizes) >= 256
