"""A GGUF's tensors go into tr's kernels from their ggml blocks (gguf_repack.cpp, gguf_tensors.py):
the values the layers hold, type by type, against gguf's own dequantize of the file; whole tiny
models loaded that way against transformers' `generate` and against the float route (the file
dequantized, then quantized as a checkpoint is); what is refused; and the caches beside a GGUF
(tokenizer and config, tr's kernels) rebuilt when damaged, never trusted."""

from __future__ import annotations

import copy
import math
import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from tiny_gguf import default_types, random_blocks, write_tiny_gguf
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.errors import ModelError
from tr_cli.models import Runtime, load_model, native_kernels
from tr_cli.models.file_embedding import FileEmbedding
from tr_cli.models.gguf_cache import MANIFEST, gguf_side_files
from tr_cli.models.gguf_header import read_header
from tr_cli.models.gguf_tensors import GGUFFile, GGUFWeight
from tr_cli.models.quantized_embedding import QuantizedEmbedding
from tr_cli.models.weights import Q4Linear, Q5Linear, Q8Linear

from tiny_models import random_prompt, reference, tiny_model

ROWS = 20  # not a multiple of 8: the padded column block is covered


def one_tensor_file(tmp_path, ggml_type: T, rows: int = ROWS, columns: int = 256) -> tuple[GGUFWeight, np.ndarray]:
    """A GGUF holding one (rows, columns) matrix of `ggml_type` and what gguf dequantizes it to."""
    path = tmp_path / f"{ggml_type.name}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    data = random_blocks(ggml_type, rows, columns, seed=int(ggml_type))
    writer.add_tensor("w", data, raw_dtype=ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(path)
    values = gguf.quants.dequantize(data, ggml_type).reshape(rows, columns)
    return GGUFWeight(GGUFFile(path, header), header.tensors[0]), values


def held(layer) -> torch.Tensor:
    """The weights a layer on tr's kernels holds, in float32, its padding rows cut off."""
    levels, steps, minimums = layer.unpacked()
    groups = levels.float().reshape(levels.shape[0], -1, 32)
    values = groups * steps.float()[..., None]
    if minimums is not None:
        values = values + minimums.float()[..., None]
    return values.reshape(levels.shape[0], -1)[: layer.out_features]


@pytest.mark.parametrize(
    ("ggml_type", "kind"),
    [
        (T.Q4_0, Q4Linear),
        (T.Q4_1, Q4Linear),
        (T.Q8_0, Q8Linear),
        (T.Q5_0, Q8Linear),
        (T.Q5_0, Q5Linear),
        (T.Q5_1, Q5Linear),
        (T.Q4_0, Q5Linear),
        (T.Q4_1, Q5Linear),
    ],
)
def test_blocks_the_kernels_hold_as_stored_come_back_bit_for_bit(tmp_path, tr_kernels, ggml_type, kind):
    weight, values = one_tensor_file(tmp_path, ggml_type)
    layer = kind.from_source(weight, ROWS, 256, None)
    assert layer.padded and torch.equal(held(layer), torch.from_numpy(values))
    if kind is Q5Linear and ggml_type in (T.Q5_0, T.Q5_1):  # the fifth bits really reach the levels
        assert layer.unpacked()[0].max() > 15


@pytest.mark.parametrize(("ggml_type", "kind"), [(T.Q4_K, Q4Linear), (T.Q4_K, Q5Linear), (T.Q5_K, Q5Linear)])
def test_k_quants_differ_only_by_rounding_each_steps_and_minimum_to_float16(tmp_path, tr_kernels, ggml_type, kind):
    """Q4_K's and Q5_K's value d·sc·q − dmin·m has a 17-bit step d·sc: the kernels' float16 step and
    minimum round it. Measured on random blocks (scales 1e-3..1e-2): about 9 in 10 weights differ, by
    at most 2⁻¹¹ of (|step·q| + |minimum|) (half a float16 unit on each), ~1e-5 of a typical weight."""
    weight, values = one_tensor_file(tmp_path, ggml_type, rows=64, columns=512)
    ours = held(kind.from_source(weight, 64, 512, None))
    theirs = torch.from_numpy(values)
    levels, steps, minimums = kind.from_source(weight, 64, 512, None).unpacked()
    assert levels.max() == (31 if ggml_type == T.Q5_K else 15)
    bound = (levels.float() * steps.float().repeat_interleave(32, 1)).abs() + minimums.float().abs().repeat_interleave(
        32, 1
    )
    error = (ours - theirs).abs()
    assert (error <= bound[:64] * 2**-11 + 1e-12).all()
    assert 0.5 < (error > 0).float().mean() < 1  # rounding happens, and not everywhere


@pytest.mark.parametrize(
    ("ggml_type", "kind"),
    [
        (T.Q6_K, Q8Linear),
        (T.Q5_1, Q8Linear),
        (T.Q5_K, Q8Linear),
        (T.Q4_K, Q8Linear),
        (T.Q3_K, Q4Linear),
        (T.Q2_K, Q4Linear),
        (T.Q3_K, Q5Linear),
        (T.Q2_K, Q5Linear),
        (T.F16, Q8Linear),
        (T.F16, Q5Linear),
    ],
)
def test_other_types_are_requantized_within_half_a_step(tmp_path, tr_kernels, ggml_type, kind):
    """Types the kernels' kind does not hold as stored: the file's values dequantized, then quantized as
    a float weight is, so each weight is off by at most half its group's step."""
    weight, values = one_tensor_file(tmp_path, ggml_type)
    layer = kind.from_source(weight, ROWS, 256, None)
    _, steps, _ = layer.unpacked()
    error = (held(layer) - torch.from_numpy(values)).abs()
    assert (error <= steps.float().repeat_interleave(32, 1)[:ROWS] * 0.5001 + 1e-7).all()


@pytest.mark.parametrize(
    ("ggml_type", "kind"),
    [(t, Q8Linear) for t in (T.Q4_0, T.Q4_1, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)]
    + [(T.Q2_K, Q4Linear), (T.Q3_K, Q4Linear), (T.Q2_K, Q5Linear), (T.Q3_K, Q5Linear)],
)
def test_types_requantized_in_the_kernels_build_are_the_python_routes_numbers(tmp_path, tr_kernels, ggml_type, kind):
    """gguf_repack.cpp requantizes these into int8 buffers itself (a Q4_K_M file's Q6_K layers, an
    int8 model's Q4_K ones: 0.86 s of every 0.5B start through numpy): bit for bit what gguf's
    dequantize then Q8Linear's quantizing give, padding rows included."""
    weight, _ = one_tensor_file(tmp_path, ggml_type, rows=ROWS, columns=512)
    native, python = weight.buffers(kind), weight._requantized(kind)
    assert native.keys() == python.keys() == ({"levels", "steps"} | ({"minimums"} if kind is not Q8Linear else set()))
    for name in native:
        assert torch.equal(native[name], python[name]), name
    assert python["steps"][: ROWS // 8].float().std() > 0  # real, varied groups were compared


# --- whole models --------------------------------------------------------------------------------


def tiny(arch: str, tied: bool, hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        vocab_size=320,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=256,
        eos_token_id=3,
        bos_token_id=1,
        tie_word_embeddings=tied,
    )
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


def loaded(path, weights: str, cache) -> torch.nn.Module:
    return load_model(str(path), Runtime.resolve("cpu", "float32", weights), cache=cache).model


MODELS = [
    ("llama", True, "int4", default_types(T.Q4_1, T.Q8_0)),
    ("llama", False, "int8", default_types(T.Q8_0, T.Q5_0)),
    ("qwen2", True, "int8", default_types(T.Q5_0, T.Q8_0)),
    ("qwen2", False, "int4", default_types(T.Q4_0, T.Q4_1)),
]


def llama_cpp_rope_factors(inv_freq: torch.Tensor, scaling: dict) -> np.ndarray:
    """What llama.cpp's converter writes as rope_freqs for a Llama 3.1+ config's llama3 scaling: per
    frequency 1 (short wavelengths), `factor` (long ones), or the smooth mix between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for frequency in inv_freq.tolist():
        wavelength = 2 * math.pi / frequency
        if wavelength < old / high:
            factors.append(1.0)
        elif wavelength > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024,
}


@pytest.mark.parametrize("weights", ["int8", "dense"])
def test_a_llama_3_files_rope_factors_give_the_llama3_rotary_frequencies(tmp_path, tr_kernels, weights):
    """A Llama 3.1+ GGUF holds its llama3 rope scaling as rope_freqs.weight (llama.cpp divides each
    frequency by its factor; the metadata names no scaling, and transformers' GGUF loader skips the
    tensor): the loaded model rotates with transformers' own llama3 frequencies for that scaling (the
    factors of this tiny model fall in all three regions), and tr equals `generate` on it."""
    model = tiny("llama", tied=True)
    plain = model.model.rotary_emb.inv_freq.clone()
    factors = llama_cpp_rope_factors(plain, LLAMA3_SCALING)
    assert (factors == 1).any() and (factors == LLAMA3_SCALING["factor"]).any()
    assert ((factors > 1) & (factors < LLAMA3_SCALING["factor"])).any()
    path = write_tiny_gguf(tmp_path / "tiny.gguf", model, extra={"rope_freqs.weight": factors})
    ours = loaded(path, weights, tmp_path / "cache")
    config = copy.deepcopy(model.config)
    config.rope_parameters = {
        "rope_type": "llama3",
        "rope_theta": config.rope_parameters["rope_theta"],
        **LLAMA3_SCALING,
    }
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    assert torch.allclose(ours.model.rotary_emb.inv_freq, want, rtol=1e-6, atol=0)
    assert not torch.allclose(plain, want)
    decoder = TokenRecyclingDecoder(ours)
    ids = random_prompt(20, 3)
    assert decoder.generate(ids, StopCondition.build(16, [3])).tokens == reference(ours, ids, 16)


@pytest.mark.parametrize("damage", ["count", "zero", "nan"])
def test_rope_factors_that_do_not_fit_the_rotary_embedding_are_refused(tmp_path, tr_kernels, damage):
    model = tiny("llama", tied=True)
    frequencies = model.model.rotary_emb.inv_freq.numel()
    factors = np.ones(frequencies + 2 if damage == "count" else frequencies)
    factors[-1] = {"count": 1.0, "zero": 0.0, "nan": np.nan}[damage]
    path = write_tiny_gguf(tmp_path / "tiny.gguf", model, extra={"rope_freqs.weight": factors})
    said = "holds factors that are not positive numbers"
    if damage == "count":
        said = f"holds {frequencies + 2} factors for {frequencies}"
    with pytest.raises(ModelError, match=f"tiny.gguf: rope_freqs.weight {said}"):
        loaded(path, "int8", tmp_path / "cache")


@pytest.mark.parametrize(("arch", "tied", "weights", "types"), MODELS)
def test_a_gguf_on_tr_kernels_is_lossless_against_generate(tmp_path, tr_kernels, arch, tied, weights, types):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny(arch, tied), types)
    model = loaded(path, weights, tmp_path / "cache")
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if tied:  # the head's buffers: no second copy
        assert isinstance(embedding, QuantizedEmbedding) and head.levels.data_ptr() == embedding.levels.data_ptr()
    else:  # read from the file where it lies, nothing of its own in memory
        assert isinstance(embedding, FileEmbedding) and not list(embedding.parameters())
    assert embedding.scale is None  # a plain nn.Embedding: its rows as they are, nothing multiplied
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    decoder = TokenRecyclingDecoder(model)
    for seed, (length, budget) in enumerate([(5, 12), (20, 30)]):
        ids = random_prompt(length, seed)
        decoder.reset()
        assert decoder.generate(ids, StopCondition.build(budget, [3])).tokens == reference(model, ids, budget)


@pytest.mark.parametrize(("arch", "matrices"), [("llama", T.Q8_0), ("qwen2", T.Q4_1)])
def test_the_direct_route_is_the_float_routes_model(tmp_path, tr_kernels, arch, matrices):
    """Q8_0 and Q4_1 blocks quantized again from their float values give the same blocks, so the model
    read from the blocks computes what the file dequantized and quantized as a checkpoint computes:
    the same logits, bit for bit, and the rotary frequencies of a model built on the CPU (the
    embedding and head in float32 here: the float route keeps those dense and int8)."""
    from tr_cli.models.weights import quantize
    from tr_cli.models.weights_mode import WeightsMode

    reference_model = tiny(arch, tied=False)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", reference_model, default_types(matrices, T.F32, T.F32))
    direct = loaded(path, "int8" if matrices == T.Q8_0 else "int4", tmp_path / "cache")
    dense = loaded(path, "dense", tmp_path / "cache")
    quantize(dense, WeightsMode("int8" if matrices == T.Q8_0 else "int4"))
    ids = torch.tensor([random_prompt(16, 0)])
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, dense(ids).logits)
    assert torch.equal(direct.model.rotary_emb.inv_freq, reference_model.model.rotary_emb.inv_freq)


def test_dense_weights_are_what_transformers_gguf_loader_reads(tmp_path, tr_kernels):
    """`--weights dense` dequantizes each tensor at load (nothing written): the very tensors transformers'
    own GGUF loader makes, llama's permuted q/k rows included."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny("llama", tied=False, hidden=256), default_types(T.Q4_K, T.Q6_K))
    ours = loaded(path, "dense", tmp_path / "cache").state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    assert sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir() if p.is_dir())  # side files only
    assert not list((tmp_path / "cache").rglob("*.safetensors"))


def test_k_quants_on_tr_kernels_are_lossless_against_generate(tmp_path, tr_kernels):
    """A Q4_K_M-like mix (Q4_K matrices, Q6_K embedding and v/down): q/k/v fuse into one int8 layer
    (the finest member's kind), gate/up stay int4, and tr equals `generate`."""

    def mix(name: str, array: np.ndarray) -> T:
        if array.ndim < 2:
            return T.F32
        return T.Q6_K if name.startswith("token_embd") or "attn_v" in name or "ffn_down" in name else T.Q4_K

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny("qwen2", tied=True, hidden=256), mix)
    model = loaded(path, "int4", tmp_path / "cache")
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Q8Linear) and isinstance(layer.mlp.gate_up_proj, Q4Linear)
    assert isinstance(layer.mlp.down_proj, Q8Linear)
    decoder = TokenRecyclingDecoder(model)
    ids = random_prompt(12, 1)
    assert decoder.generate(ids, StopCondition.build(24, [3])).tokens == reference(model, ids, 24)


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_5_bit_types_are_held_as_int5_in_either_mode(tmp_path, tr_kernels, weights):
    """A Q5 mix (Q5_0 matrices, Q8_0 v, Q5_K gate, Q4_K down: a Q5_K_M- and a 0.5B Qwen2-like file):
    each layer in the kind holding its stored values, int5 for 5 bits whatever the mode (fewer bytes
    than int8, the same values), a fused group in its finest member's kind; 4-bit layers int4 in an
    int4 model and int5 in an int8 one (their stored levels and steps, not an int8 requantization);
    and tr equals `generate`."""

    def mix(name: str, array: np.ndarray) -> T:
        if array.ndim < 2:
            return T.F32
        if "attn_v" in name or name.startswith(("token_embd", "output")):
            return T.Q8_0
        return {"ffn_gate": T.Q5_K, "ffn_down": T.Q4_K}.get(name.split(".")[2] if "blk" in name else "", T.Q5_0)

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny("qwen2", tied=False, hidden=256), mix)
    model = loaded(path, weights, tmp_path / "cache")
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Q8Linear)  # q/k Q5_0 with v Q8_0
    assert type(layer.self_attn.o_proj) is Q5Linear and type(layer.mlp.gate_up_proj) is Q5Linear
    assert type(layer.mlp.down_proj) is (Q4Linear if weights == "int4" else Q5Linear)
    assert type(model.lm_head) is Q8Linear
    decoder = TokenRecyclingDecoder(model)
    for seed, (length, budget) in enumerate([(12, 24), (30, 20)]):
        ids = random_prompt(length, seed)
        decoder.reset()
        assert decoder.generate(ids, StopCondition.build(budget, [3])).tokens == reference(model, ids, budget)


def test_a_type_tr_cannot_read_is_refused_in_one_line_naming_the_tensor(tmp_path, tr_kernels):
    model = tiny("llama", tied=True)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", model, default_types(T.Q8_0))
    # Q8_1 (an intermediate type of llama.cpp's, in no model file): sizes known, no reader
    data = bytearray(path.read_bytes())
    header = read_header(path)
    q8 = next(t for t in header.tensors if t.name == "blk.0.attn_q.weight")
    table = data.index(b"blk.0.attn_q.weight") + len("blk.0.attn_q.weight")
    type_at = table + 4 + 8 * len(q8.dims)
    assert int.from_bytes(data[type_at : type_at + 4], "little") == int(T.Q8_0)
    data[type_at : type_at + 4] = int(T.Q8_1).to_bytes(4, "little")  # 36 bytes a block instead of 34: fits
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data) + b"\0" * q8.nbytes)
    with pytest.raises(ModelError) as caught:
        loaded(bad, "int8", tmp_path / "cache")
    assert str(caught.value).startswith(
        "model bad.gguf: tensor blk.0.attn_q.weight is stored as Q8_1, which tr cannot read"
    )
    assert "\n" not in str(caught.value)


def test_a_ggufs_tokenizer_is_read_once_a_process(tmp_path, tr_kernels, tiny_llama_dir):
    """`tr generate` reads the tokenizer to check the prompt against the context, then loads the
    model: a GGUF's (its side files named by the file's hash) is read once, a directory's each time
    (its files may change under the same name)."""
    from tr_cli.models import load_prompt_side

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny("llama", tied=True))
    cache = tmp_path / "cache"
    first, _ = load_prompt_side(str(path), cache=cache)
    model = load_model(str(path), Runtime.resolve("cpu", "float32", "int4"), cache=cache)
    assert model.tokenizer is first
    again, _ = load_prompt_side(str(tiny_llama_dir), cache=cache)
    assert load_prompt_side(str(tiny_llama_dir), cache=cache)[0] is not again


# --- caches beside a GGUF: validated before use, rebuilt when damaged ------------------------------


@pytest.mark.parametrize(
    "damage",
    ["empty tokenizer.json", "garbage config.json", "truncated tokenizer.json", "no manifest", "no config.json"],
)
def test_a_damaged_tokenizer_or_config_cache_is_converted_again(tmp_path, damage):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny("llama", tied=True))
    root = tmp_path / "cache"
    said: list[str] = []
    target = gguf_side_files(path, root, said.append)
    files = {p.name: p.read_bytes() for p in target.iterdir()}
    victim = {
        "empty tokenizer.json": "tokenizer.json",
        "garbage config.json": "config.json",
        "truncated tokenizer.json": "tokenizer.json",
        "no manifest": MANIFEST,
        "no config.json": "config.json",
    }[damage]
    if damage.startswith("no "):
        (target / victim).unlink()
    else:
        content = {"empty": b"", "garbage": b"\x00garbage{", "truncated": files[victim][:100]}[damage.split()[0]]
        (target / victim).write_bytes(content)
    said.clear()
    again = gguf_side_files(path, root, said.append)
    assert any(line.startswith("Reading tiny.gguf's tokenizer and config") for line in said)  # converted again
    assert {p.name: p.read_bytes() for p in again.iterdir()} == files
    AutoTokenizer.from_pretrained(again)  # whole again


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_kernel_library_is_built_again_never_loaded(tmp_path, tr_kernels, monkeypatch, damage):
    """A library cut short or overwritten crashes dlopen (a bus error, a segfault: no exception to
    catch), so it is checked against its build's checksum first and built again."""
    key = tmp_path / native_kernels._build_key(torch.__version__)
    key.mkdir()
    library = key / tr_kernels.name
    good = tr_kernels.read_bytes()
    shutil.copy(tr_kernels.parent / native_kernels._CHECKSUM, key / native_kernels._CHECKSUM)
    library.write_bytes(
        {"truncated": good[:1000], "garbage": b"\x7fELF" + bytes(range(256)) * 40, "empty": b""}[damage]
    )
    built, opened = [], []

    def rebuild(target, status=None):
        built.append(target)
        target.write_bytes(good)

    monkeypatch.setattr(native_kernels, "_loaded", None)
    monkeypatch.setattr(native_kernels, "_build", rebuild)
    monkeypatch.setattr(torch.ops, "load_library", lambda where: opened.append(where))
    assert native_kernels.load(tmp_path) == library
    assert built == [library] and opened == [str(library)]
    monkeypatch.setattr(native_kernels, "_loaded", None)
    native_kernels.load(tmp_path)  # whole now: loaded as it is
    assert built == [library] and opened == [str(library)] * 2


@pytest.mark.parametrize(("ggml_type", "kind"), [(T.Q4_1, Q4Linear), (T.Q8_0, Q8Linear)])
def test_a_quantized_embeddings_rows_are_the_files_rows(tmp_path, tr_kernels, ggml_type, kind):
    weight, values = one_tensor_file(tmp_path, ggml_type, rows=40, columns=64)
    embedding = QuantizedEmbedding(kind.from_source(weight, 40, 64, None))
    ids = torch.tensor([[3, 0, 39, 3], [17, 8, 9, 31]])
    assert torch.equal(embedding(ids), torch.from_numpy(values)[ids])


def test_a_quantized_embedding_refuses_int5_levels_it_would_misread(tmp_path, tr_kernels):
    """Its lookup unpacks int4 and int8 blocks; int5's fifth bits (a head is never int5) would be
    read as nibbles: refused, never wrong rows."""
    weight, _ = one_tensor_file(tmp_path, T.Q5_0, rows=40, columns=64)
    with pytest.raises(ValueError, match="int5"):
        QuantizedEmbedding(Q5Linear.from_source(weight, 40, 64, None))


@pytest.mark.parametrize(
    ("embedding", "weights", "tied"),
    [(T.Q8_0, "int8", True), (T.Q4_1, "int4", True), (T.Q5_0, "int8", False)],
    ids=["tied-Q8_0", "tied-Q4_1", "untied-Q5_0"],
)
def test_gemmas_scaled_embedding_stays_quantized_and_gives_the_models_rows(
    tmp_path, tr_kernels, embedding, weights, tied
):
    """Gemma's embedding multiplies its rows by sqrt(hidden): kept quantized (tied: the head's buffers;
    untied: read from the file), not a dense float copy (671 MB for Gemma 3's 262,144 tokens), it
    gives the rows the dense route's embedding gives, bit for bit, and the model decodes as
    `generate` does on it."""
    path = write_tiny_gguf(
        tmp_path / "gemma3.gguf", tiny_model("gemma3" if tied else "gemma3-untied"), default_types(T.Q8_0, embedding)
    )
    model = loaded(path, weights, tmp_path / "cache")
    ours, head = model.get_input_embeddings(), model.get_output_embeddings()
    if tied:
        assert isinstance(ours, QuantizedEmbedding) and head.levels.data_ptr() == ours.levels.data_ptr()
    else:
        assert isinstance(ours, FileEmbedding) and not list(ours.parameters())
    assert float(ours.scale) == pytest.approx(model.config.hidden_size**0.5)
    dense = loaded(path, "dense", tmp_path / "cache").get_input_embeddings()
    assert type(dense) is not torch.nn.Embedding  # the model's own scaled embedding
    ids = torch.tensor([random_prompt(24, 1)])
    with torch.no_grad():
        assert torch.equal(ours(ids), dense(ids))
    decoder = TokenRecyclingDecoder(model)
    assert decoder.generate(ids[0].tolist(), StopCondition.build(20, [3])).tokens == reference(
        model, ids[0].tolist(), 20
    )


class _Scaled(torch.nn.Embedding):
    def __init__(self, rows: int, width: int, plus: float = 0.0) -> None:
        super().__init__(rows, width)
        self.embed_scale = torch.nn.Buffer(torch.tensor(0.0), persistent=False)
        self.plus = plus

    def forward(self, ids):
        return super().forward(ids) * self.embed_scale + self.plus


class _Unscaled(torch.nn.Embedding):
    """A subclass with no scale of its own."""


class _Positional(_Scaled):
    """A scaled embedding whose forward takes more than the ids (the probe cannot run it)."""

    def forward(self, ids, positions):
        return super().forward(ids) + positions


class _Model(torch.nn.Module):
    """What _lookup_scale asks of the model: transformers' `_init_weights`, which computes buffers."""

    def _init_weights(self, module):
        if isinstance(module, _Scaled):
            module.embed_scale.fill_(3.5)


def test_only_an_embedding_that_scales_its_rows_is_read_as_scaled_rows():
    """The factor is read off the subclass's own forward, on the meta device as at load: a forward that
    computes anything besides scaled rows (or has no scale) keeps its embedding dense."""
    from tr_cli.models.gguf_load import _lookup_scale

    with torch.device("meta"):
        scaled, shifted = _Scaled(1000, 32), _Scaled(1000, 32, plus=1.0)
        other, positional = _Unscaled(1000, 32), _Positional(1000, 32)
    assert float(_lookup_scale(_Model(), scaled)) == 3.5
    assert _lookup_scale(_Model(), shifted) is None
    assert _lookup_scale(_Model(), other) is None
    assert _lookup_scale(_Model(), positional) is None
    assert scaled.weight.is_meta and scaled.embed_scale.is_meta  # the model's own module untouched


@pytest.mark.parametrize("ggml_type", [T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F16])
def test_an_untied_embedding_read_from_the_file_gives_the_files_rows(tmp_path, ggml_type):
    """Rows looked up in the file's own blocks are gguf's dequantized rows exactly, for any type
    (k-quants included: nothing folded or rounded), in the ids' shape; an id past the vocabulary
    is refused as nn.Embedding refuses it, never read past the tensor."""
    weight, values = one_tensor_file(tmp_path, ggml_type, rows=40, columns=256)
    embedding = FileEmbedding(weight.file.path, weight.file.header.data_start, weight.tensor)
    ids = torch.tensor([[3, 0, 39, 3], [17, 8, 9, 31]])
    assert embedding.num_embeddings == 40 and embedding.embedding_dim == 256
    assert torch.equal(embedding(ids), torch.from_numpy(values)[ids])
    assert embedding(torch.zeros(1, 0, dtype=torch.long)).shape == (1, 0, 256)
    for bad in (40, -1):
        with pytest.raises(IndexError, match="out of range"):
            embedding(torch.tensor([[1, bad]]))
