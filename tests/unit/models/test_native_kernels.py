"""tr's own kernels (models/quantized_matmul.cpp, row_attention.cpp): the arithmetic they promise,
rows computed alone, GGUF's Q4_1/Q5_1/Q8_0 blocks kept bit for bit, operands checked, the row-exact
attention against SDPA, and a build that fails or cannot run said in one line."""

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import quants

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.core.kv_cache import KEEP_ROWS
from tr_cli.core.tree import PRESETS
from tr_cli.core.verify import ROW_TOPK
from tr_cli.models import native_kernels
from tr_cli.models.cpu import cpu_flags
from tr_cli.models.weights import (
    Q4Linear,
    Q5Linear,
    Q8Linear,
    _column_blocks,
    _column_values,
    quantize,
    weights_mode,
)
from tr_cli.models.weights_mode import WeightsMode

from tiny_models import ARCHITECTURES, EOS, random_prompt, reference, tiny_model

pytestmark = pytest.mark.usefixtures("tr_kernels")


def quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations as the kernels quantize them: int8 levels and one step per 32 values of a row."""
    groups = x.reshape(x.shape[0], -1, 32)
    largest = groups.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(largest > 0, 127 / largest, torch.zeros_like(largest))
    return torch.round(groups * inverse), largest / 127


def expected(x: torch.Tensor, layer: Q4Linear | Q8Linear) -> torch.Tensor:
    """y = sum over groups of d_w d_x (q . a) (+ minimum_w d_x sum(a) for int4/int5), in float64."""
    levels, steps = quantized_rows(x)
    groups = levels.shape[1]
    w_levels, w_steps, w_minimums = layer.unpacked()
    outputs = layer.out_features
    q = w_levels[:outputs].reshape(outputs, groups, 32).double()
    w_steps = w_steps[:outputs].double()
    minimums = torch.zeros_like(w_steps) if w_minimums is None else w_minimums[:outputs].double()
    dots = torch.einsum("mgi,ngi->mng", levels.double(), q)
    a_sums = (levels.double().sum(-1) * steps[..., 0].double())[:, None, :]
    return (dots * w_steps[None] * steps[..., 0].double()[:, None, :] + minimums[None] * a_sums).sum(-1)


@pytest.mark.parametrize("kind", [Q4Linear, Q5Linear, Q8Linear])
@pytest.mark.parametrize(("outputs", "inputs"), [(83, 96), (64, 576), (7, 32), (130, 288)])
def test_the_kernels_compute_the_quantized_arithmetic(kind, outputs, inputs):
    """Output counts that are not a multiple of 8 (a padded column block, cut off), odd group counts,
    and 1 to 13 rows (every row-tile size, and tails)."""
    torch.manual_seed(outputs + inputs)
    layer = kind.quantized(torch.randn(outputs, inputs), None)
    for rows in range(1, 14):
        x = torch.randn(rows, inputs) * 3
        got = layer(x).double()
        want = expected(x, layer)
        assert got.shape == (rows, outputs)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("kind", [Q4Linear, Q5Linear, Q8Linear])
def test_each_row_is_computed_alone(kind):
    """A row gives the same bits alone as among any others: what lets a tree's rows stand for
    one-token steps exactly."""
    torch.manual_seed(1)
    layer = kind.quantized(torch.randn(288, 192), torch.randn(288))
    x = torch.randn(21, 192)
    together = layer(x)
    for start in range(21):
        assert torch.equal(layer(x[start : start + 1]), together[start : start + 1])
    for rows in (2, 3, 4, 5, 8, 9, 13):
        assert torch.equal(layer(x[3 : 3 + rows]), together[3 : 3 + rows])
    views = layer.rows(96, 232)  # a fused layer's sibling: a row view of its weights
    assert torch.equal(views(x), together[:, 96:232])


def int8_layer(levels: torch.Tensor, steps: torch.Tensor) -> Q8Linear:
    """A layer on tr's int8 kernels holding exactly these levels (out, in) and steps (out, in / 32)."""
    outputs, inputs = levels.shape
    buffers = {
        "levels": _column_blocks(levels.to(torch.int8).reshape(outputs, inputs // 32, 32), 32),
        "steps": _column_values(steps.half()),
    }
    return Q8Linear(inputs, outputs, None, buffers)


@pytest.mark.parametrize("widest", [15, 16, 17, 31, 32, 33, 64, 65, 127, 128])
def test_narrow_int8_levels_add_up_exactly(widest):
    """Levels of fewer bits (GGUF's Q5_0, -16..15; Q6_K's ~6 bits) let the AVX2 kernel add several
    products in int16 before widening them; every block's widest level decides how many. At the
    limits (every level at its widest, activations at +-127 with the weights' signs, so that each
    int16 sum is as large as it gets) a row among others must still give its bits alone, where it
    takes the one-product-at-a-time path, and the exact sums. One group past the limit, in the last
    group of one block only, must send that block back to the wide path."""
    torch.manual_seed(widest)
    outputs, inputs = 48, 4864  # 152 groups: a down projection's inputs
    low = -128 if widest == 128 else -widest
    high = min(widest, 127)
    levels = torch.randint(low, high + 1, (outputs, inputs))
    levels[:8] = torch.where(torch.rand(8, inputs) < 0.5, low, high)  # one block all at the extremes
    levels[16:24, -32:] = torch.randint(-127, 128, (8, 32))  # a wide last group in one block
    layer = int8_layer(levels, torch.rand(outputs, inputs // 32) * 0.01 + 1e-3)
    x = torch.randn(9, inputs)
    x[:4] = torch.sign(levels[:4].float()) * 2.0  # rows whose products all share the weights' sign
    x[4] = -x[0]
    together = layer(x)
    for row in range(9):
        assert torch.equal(layer(x[row : row + 1]), together[row : row + 1])
    want = expected(x, layer)
    assert torch.allclose(together.double(), want, rtol=1e-5, atol=1e-4 * want.abs().max().item())


def int5_layer(levels: torch.Tensor, steps: torch.Tensor, minimums: torch.Tensor) -> Q5Linear:
    """A layer on tr's int5 kernels holding exactly these levels 0-31 (out, in), steps and minimums."""
    outputs, inputs = levels.shape
    buffers = {
        "levels": _column_blocks(levels.to(torch.uint8).reshape(outputs, inputs // 32, 32), 20),
        "steps": _column_values(steps.half()),
        "minimums": _column_values(minimums.half()),
    }
    return Q5Linear(inputs, outputs, None, buffers)


def test_int5_levels_at_their_widest_add_up_exactly():
    """The AVX2 kernel adds int5's products in int16 over half a group: with every level at 31 and
    every activation at +127 (or -127) each int16 sum is as large as it gets, and the outputs must
    still be the exact sums, a row alone as among others; every fifth-bit position (each of the eight
    vectors of a group, both nibbles) set alone must reach its own inputs."""
    torch.manual_seed(31)
    outputs, inputs = 40, 4864
    levels = torch.randint(0, 32, (outputs, inputs))
    levels[:8] = 31
    levels[8:16] = torch.where(torch.rand(8, inputs) < 0.5, 0, 31)
    for input_index in range(32):  # rows 16..23: one level of 16 (the fifth bit alone) per group
        levels[16 + input_index % 8, input_index::32] = 16
    layer = int5_layer(levels, torch.rand(outputs, inputs // 32) * 0.01 + 1e-3, -torch.rand(outputs, inputs // 32))
    unpacked, _, _ = layer.unpacked()
    assert torch.equal(unpacked[:outputs].long(), levels)
    x = torch.randn(9, inputs)
    x[0], x[1] = 2.0, -2.0  # quantized to +-127 in every group
    together = layer(x)
    for row in range(9):
        assert torch.equal(layer(x[row : row + 1]), together[row : row + 1])
    want = expected(x, layer)
    assert torch.allclose(together.double(), want, rtol=1e-5, atol=1e-4 * want.abs().max().item())


def test_row_views_take_whole_column_blocks():
    """The kernels read outputs in blocks of eight: a view cutting a block (or of a padded layer) is
    refused, and siblings whose sizes are not multiples of 8 stay separate layers."""
    layer = Q4Linear.quantized(torch.randn(64, 64), None)
    with pytest.raises(ValueError, match="blocks of 8"):
        layer.rows(4, 32)
    padded = Q8Linear.quantized(torch.randn(20, 64), None)
    assert padded.padded and padded.levels.shape[0] == 3
    with pytest.raises(ValueError, match="blocks of 8"):
        padded.rows(0, 8)


def test_the_unpacked_values_are_the_quantized_ones():
    """The blocked layout holds each output's levels, steps and minimums: dequantized, they give the
    weights back to within half a step."""
    weight = torch.randn(40, 96)
    for kind in (Q4Linear, Q5Linear, Q8Linear):
        levels, steps, minimums = kind.quantized(weight, None).unpacked()
        values = levels.float().reshape(40, 3, 32) * steps.float()[..., None]
        if minimums is not None:
            values = values + minimums.float()[..., None]
        assert torch.all((values.reshape(40, 96) - weight).abs() <= steps.float().repeat_interleave(32, 1) / 2 + 1e-3)


def test_zero_activations_and_constant_weight_groups():
    weight = torch.randn(16, 64)
    weight[:, :32] = 0.25  # a constant group: step 0
    layer = Q4Linear.quantized(weight, None)
    assert torch.equal(layer(torch.zeros(2, 64)), torch.zeros(2, 16))
    x = torch.zeros(1, 64)
    x[0, :32] = 1.0
    assert torch.allclose(layer(x), torch.full((1, 16), 8.0))  # 32 inputs of 1 times 0.25


def gguf_blocks(weight: np.ndarray, kind: gguf.GGMLQuantizationType) -> tuple[torch.Tensor, np.ndarray]:
    """A tensor through GGUF's own quantizer: its dequantized values and its raw blocks."""
    raw = quants.quantize(weight, kind)
    return torch.from_numpy(quants.dequantize(raw, kind).copy()), raw.reshape(
        weight.shape[0], -1, raw.shape[1] // (weight.shape[1] // 32)
    )


def test_a_q4_1_tensor_comes_back_bit_for_bit():
    """A GGUF Q4_1 tensor loaded dequantized (as transformers loads it) and quantized again holds
    the file's own steps, minimums and levels."""
    weight = np.random.default_rng(0).standard_normal((48, 256)).astype(np.float32)
    values, blocks = gguf_blocks(weight, gguf.GGMLQuantizationType.Q4_1)
    layer = Q4Linear.quantized(values, None)
    steps = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    minimums = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    levels, got_steps, got_minimums = layer.unpacked()
    assert np.array_equal(got_steps.numpy(), steps)
    assert np.array_equal(got_minimums.numpy(), minimums)
    nibbles = blocks[..., 4:]  # byte i: input i (low nibble), input i + 16 (high)
    gguf_levels = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).reshape(48, 256)
    assert np.array_equal(levels.numpy(), gguf_levels)
    x = torch.randn(3, 256)
    assert torch.allclose(layer(x), x @ values.t(), rtol=0.05, atol=0.5)  # activations quantized


def test_a_q5_1_tensor_comes_back_bit_for_bit():
    """The same for int5: a GGUF Q5_1 tensor's steps, minimums and 5-bit levels."""
    weight = np.random.default_rng(2).standard_normal((48, 256)).astype(np.float32)
    values, blocks = gguf_blocks(weight, gguf.GGMLQuantizationType.Q5_1)
    layer = Q5Linear.quantized(values, None)
    levels, steps, minimums = layer.unpacked()
    assert np.array_equal(steps.numpy(), blocks[..., 0:2].copy().view(np.float16)[..., 0])
    assert np.array_equal(minimums.numpy(), blocks[..., 2:4].copy().view(np.float16)[..., 0])
    fifth = blocks[..., 4:8].copy().view(np.uint32)  # bit j: input j's fifth bit
    nibbles = blocks[..., 8:]
    bits = (fifth >> np.arange(32, dtype=np.uint32)) & 1
    gguf_levels = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1) | (bits << 4).astype(np.uint8)
    assert np.array_equal(levels.numpy(), gguf_levels.reshape(48, 256))


def test_a_q8_0_tensor_comes_back_bit_for_bit():
    weight = np.random.default_rng(1).standard_normal((40, 128)).astype(np.float32)
    values, blocks = gguf_blocks(weight, gguf.GGMLQuantizationType.Q8_0)
    levels, steps, _ = Q8Linear.quantized(values, None).unpacked()
    assert np.array_equal(steps.numpy(), blocks[..., 0:2].copy().view(np.float16)[..., 0])
    assert np.array_equal(levels.numpy(), blocks[..., 2:].view(np.int8).reshape(40, 128))


def test_operands_the_kernels_do_not_take_are_refused():
    layer = Q4Linear.quantized(torch.randn(16, 64), None)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.tr_kernels.int4_mm(torch.randn(1, 64).double(), layer.levels, layer.steps, layer.minimums)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.tr_kernels.int4_mm(torch.randn(1, 48), layer.levels, layer.steps, layer.minimums)
    with pytest.raises(RuntimeError, match="levels"):
        torch.ops.tr_kernels.int4_mm(torch.randn(1, 96), layer.levels, layer.steps, layer.minimums)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_token_recycling_equals_generate_on_a_model_on_tr_kernels(arch, mode):
    """float32 models on tr's kernels: trees (the paper's 80 nodes) give generate's tokens on the
    same quantized model, as dense float32 models do."""
    model = tiny_model(arch)
    done = quantize(model, WeightsMode.parse(mode))
    assert done.layers > 0 and weights_mode(model).name == mode
    decoder = TokenRecyclingDecoder(model, tree=PRESETS["paper"])
    for seed, (length, budget) in enumerate([(5, 1), (9, 7), (20, 40), (33, 30)]):
        ids = random_prompt(length, seed)
        decoder.reset()
        assert decoder.generate(ids, StopCondition.build(budget, [EOS])).tokens == reference(model, ids, budget)


_BUILD_OUTPUTS = """
import sys, torch
from pathlib import Path
from tr_cli.models import native_kernels
from tr_cli.models.weights import Q4Linear, Q5Linear, Q8Linear
native_kernels.load(Path(sys.argv[1]))
torch.manual_seed(5)
# Every shape class of a decoder: fused q/k/v, o, gate/up, down (many groups, odd group counts),
# a padded last column block, an odd block count (a lone block), and a head's many column blocks.
shapes = [(136, 320), (192, 64), (1536, 576), (576, 1536), (83, 96), (40, 4864), (4096, 64)]
kinds = (Q4Linear, Q5Linear, Q8Linear)
layers = [kind.quantized(torch.randn(*shape), torch.randn(shape[0])) for shape in shapes for kind in kinds]
x = torch.randn(37, 4864) * 4
x[5, :64] = 0.0  # a row with all-zero groups
threads = [1, 2]
outputs = []
for count in threads:
    torch.set_num_threads(count)
    outputs += [layer(x[:rows, : layer.in_features]) for layer in layers for rows in (1, 2, 3, 7, 16, 17, 32, 37)]
torch.save([native_kernels.instruction_set(), torch.ops.tr_kernels.tile_from_rows(), *outputs], sys.argv[2])
"""

BUILDS = [
    ("AVX2", "avx2", ()),
    ("AVX512-VNNI", "vnni", native_kernels.VNNI_FLAGS),
    ("AMX", None, native_kernels.AMX_FLAGS),
]


def build_outputs(tmp_path, variant: str, forced: str | None, loaded: Path | None = None) -> list:
    """The test layers' outputs on the kernels built as `variant`, in a process of its own. Where
    `loaded` (this run's library, as `make install` built it) is that very build (the CPU's widest:
    the same flags, so the same folder name), it starts as a copy: compiling it again costs half a
    minute on 2 cores."""
    if loaded is not None and variant == native_kernels.instruction_set():
        ignore = shutil.ignore_patterns(".build-*")
        shutil.copytree(loaded.parent, tmp_path / variant / loaded.parent.name, ignore=ignore)
    env = {key: value for key, value in os.environ.items() if key != "TR_KERNELS"}
    if forced is not None:
        env["TR_KERNELS"] = forced
    path = tmp_path / f"{variant}.pt"
    script = [sys.executable, "-c", _BUILD_OUTPUTS, str(tmp_path / variant), str(path)]
    done = subprocess.run(script, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    outputs = torch.load(path)
    assert outputs[0] == variant
    # The AMX build really went through the tiles: from 16 rows on, which the test rows reach.
    assert (0 < outputs[1] <= 16) == (variant == "AMX")
    return outputs[2:]


@pytest.fixture(scope="module")
def avx2_outputs(tmp_path_factory) -> list:
    return build_outputs(tmp_path_factory.mktemp("avx2"), "AVX2", "avx2")


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "forced", "flags"), BUILDS[1:], ids=[build[0] for build in BUILDS[1:]])
def test_every_build_gives_the_avx2_builds_bits(request, tmp_path, tr_kernels, variant, forced, flags):
    """The VNNI dot products and the AMX tiles only regroup exact integer sums, and scale them in
    the AVX2 build's order: switching the build (a new machine, TR_KERNELS=avx2/vnni) must not
    change one output bit, on any shape class, row count (tiles of 16 and their tails) or thread
    count, or a calibrated matrix and the lossless promise would depend on the CPU."""
    if not set(flags) <= cpu_flags():
        pytest.skip(f"the CPU has no {variant}")
    # Asked for only here: the AVX2 build it compares against takes a minute to compile, for nothing
    # on a CPU where every other build skips.
    avx2_outputs = request.getfixturevalue("avx2_outputs")
    got = build_outputs(tmp_path, variant, forced, loaded=tr_kernels)
    assert len(got) == len(avx2_outputs)
    for built, avx2 in zip(got, avx2_outputs, strict=True):
        assert torch.equal(built, avx2)


def test_why_the_kernels_cannot_run_is_said(monkeypatch):
    monkeypatch.setenv("TR_KERNELS", "torch")
    assert native_kernels.unavailable() == "TR_KERNELS=torch"
    monkeypatch.delenv("TR_KERNELS")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert "no C++ compiler" in native_kernels.unavailable()


def test_a_failed_build_names_the_compiler_and_keeps_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that fails at once
    library = tmp_path / "key" / "tr_kernels.so"
    with pytest.raises(native_kernels.KernelBuildError, match="building tr's kernels with .*false failed") as caught:
        native_kernels._build(library)
    assert (tmp_path / "key" / "build.log").is_file() and "build.log" in str(caught.value)
    assert not library.exists() and [p.name for p in (tmp_path / "key").iterdir()] == ["build.log"]


def test_a_build_on_a_full_disk_is_one_line_and_leaves_no_log_cut_short(tmp_path, monkeypatch):
    """Issue 43: a full disk while the kernels build. The compiler fails (here at once) and its
    log cannot be written either: one line with the compiler's words and why there is no log, and
    no build.log cut short by the full disk left to be read as the whole story."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command: the full disk needs a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the full disk (needs root): {mounted.stderr.decode().strip()}")
    try:
        (disk / "key").mkdir()
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as filler:
            while True:
                filler.write(b"x" * 512)
                filler.flush()
        # A compiler that says a lot (more than the disk has left after the filler) and fails.
        noisy = tmp_path / "noisy-c++"
        noisy.write_text("#!/bin/sh\nyes 'error: No space left on device' | head -c 20000 >&2\nexit 1\n")
        noisy.chmod(0o755)
        monkeypatch.setenv("CXX", str(noisy))
        with pytest.raises(native_kernels.KernelBuildError) as caught:
            native_kernels._build(disk / "key" / "tr_kernels.so")
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"building tr's kernels with {noisy} failed: error: No space")
        assert message.endswith("(no log written: No space left on device)"), message
        assert list((disk / "key").iterdir()) == []  # no log, no scratch folder, no library
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def sdpa_reference(q, k, v, mask, scale, causal):
    """What the row attention promises, in float64 through torch's SDPA (key/value heads repeated)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1).double(), v.repeat_interleave(groups, 1).double()
    if mask is None and causal and q.shape[2] > 1:
        k, v = k[:, :, : q.shape[2]], v[:, :, : q.shape[2]]
        out = F.scaled_dot_product_attention(q.double(), k, v, is_causal=True, scale=scale)
    else:
        attn_mask = None if mask is None else mask if mask.dtype == torch.bool else mask.double()
        out = F.scaled_dot_product_attention(q.double(), k, v, attn_mask=attn_mask, scale=scale)
    return out.transpose(1, 2)


def visibility(queries: int, keys: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    seen = torch.rand(queries, keys, generator=generator) > 0.3
    seen[:, 0] = True
    return seen


ATTENTION_CASES = [
    (queries, keys, kind)
    for queries, keys in [(1, 300), (5, 40), (12, 12), (80, 300)]
    for kind in ["none", "causal", "additive", "boolean"]
    if kind != "causal" or queries == keys  # causal without a mask: a prompt over an empty cache
]


@pytest.mark.parametrize(("queries", "keys", "mask_kind"), ATTENTION_CASES)
def test_row_attention_is_scaled_dot_product_attention(queries, keys, mask_kind):
    """Grouped heads (9 query heads over 3), no mask, causal, an additive mask with the float
    minimum where hidden (as tr builds them) and a boolean one (as transformers builds them)."""
    torch.manual_seed(queries + keys)
    q, k, v = torch.randn(1, 9, queries, 64), torch.randn(1, 3, keys, 64), torch.randn(1, 3, keys, 64)
    seen = visibility(queries, keys, 0)
    mask = {
        "additive": torch.zeros(1, 1, queries, keys).masked_fill(~seen, torch.finfo(torch.float32).min),
        "boolean": seen[None, None],
    }.get(mask_kind)
    got = torch.ops.tr_kernels.row_attention(q, k, v, mask, 0.125, mask_kind == "causal")
    assert torch.allclose(got.double(), sdpa_reference(q, k, v, mask, 0.125, mask_kind == "causal"), atol=2e-6)


def test_causal_rows_over_fewer_keys_than_queries():
    """Causal without a mask over fewer keys than queries (an op call transformers never makes): each
    query sees the keys up to its own index that exist, and nothing past the keys is read."""
    torch.manual_seed(4)
    q, k, v = torch.randn(1, 9, 12, 64), torch.randn(1, 3, 5, 64), torch.randn(1, 3, 5, 64)
    got = torch.ops.tr_kernels.row_attention(q, k, v, None, 0.125, True)
    assert torch.allclose(got.double(), sdpa_reference(q, k, v, None, 0.125, True), atol=2e-6)


def test_a_query_row_is_the_same_alone_and_over_the_compacted_keys():
    """What tree verification needs: a row's output does not depend on the other queries of the
    call, nor on hidden keys between the ones it sees (a tree's siblings), bit for bit."""
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 9, 7, 64), torch.randn(1, 3, 50, 64), torch.randn(1, 3, 50, 64)
    seen = visibility(7, 50, 1)
    mask = torch.zeros(1, 1, 7, 50).masked_fill(~seen, torch.finfo(torch.float32).min)
    attention = torch.ops.tr_kernels.row_attention
    together = attention(q, k, v, mask, 0.125, False)
    for row in range(7):
        query = q[:, :, row : row + 1]
        assert torch.equal(attention(query, k, v, mask[:, :, row : row + 1], 0.125, False), together[:, row : row + 1])
        keep = seen[row].nonzero()[:, 0]
        compact = attention(query, k[:, :, keep], v[:, :, keep], None, 0.125, False)
        assert torch.equal(compact, together[:, row : row + 1])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_models_on_tr_kernels_take_the_row_attention_where_it_fits(arch):
    model = tiny_model(arch)
    before = model.config._attn_implementation
    quantize(model, WeightsMode.parse("int4"))
    expected = "tr_rows" if arch != "gpt2" else before  # the direct path's families
    assert model.config._attn_implementation == expected
    bf16 = tiny_model(arch, dtype=torch.bfloat16)
    quantize(bf16, WeightsMode.parse("int4"))  # torch's kernels: transformers' attention stays
    assert bf16.config._attn_implementation == before


@pytest.mark.parametrize(
    ("attribute", "kernel"),
    [(ROW_TOPK, native_kernels.row_topk), (KEEP_ROWS, native_kernels.keep_rows)],
    ids=["row_topk", "keep_rows"],
)
def test_models_on_tr_kernels_carry_the_steps_kernels_and_on_torchs_do_not(attribute, kernel):
    """Verification's top-k and the cache's compaction, which the decoder reads off the model."""
    native = tiny_model("llama")
    quantize(native, WeightsMode("int4"))
    assert getattr(native, attribute) is kernel
    torchs = tiny_model("llama", dtype=torch.bfloat16)
    quantize(torchs, WeightsMode("int4"))
    assert not hasattr(torchs, attribute)


def test_a_cache_dir_that_cannot_be_written_is_said_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(native_kernels.KernelBuildError, match=r"cannot write tr's kernels to .*file"):
        native_kernels._build(blocker / "key" / "tr_kernels.so")
