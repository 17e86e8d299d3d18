"""AttentionLayout: layer types and window read from real transformers configs, and the additive
4D masks for causal prefill and tree verification checked against brute-force double loops."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Gemma3Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

from tr_cli.core import PRESETS, TreeBuffers, TreeSpec
from tr_cli.core.attention import FULL, SLIDING, AttentionLayout, UnsupportedAttention, causal_visibility

SMALL = dict(
    num_hidden_layers=4,
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=50,
)


def layout(config, dtype=torch.float32) -> AttentionLayout:
    return AttentionLayout.from_config(config, dtype, "cpu")


# --- from_config ------------------------------------------------------------------------------


def test_llama_is_full():
    lay = layout(LlamaConfig(**SMALL))
    assert lay.layer_types == (FULL,)
    assert lay.sliding_window is None


def test_mistral_sliding():
    lay = layout(MistralConfig(sliding_window=4, **SMALL))
    assert lay.layer_types == (SLIDING,)
    assert lay.sliding_window == 4


def test_mistral_without_window_is_full():
    lay = layout(MistralConfig(sliding_window=None, **SMALL))
    assert lay.layer_types == (FULL,)
    assert lay.sliding_window is None


def test_gemma3_mixed_first_seen_order():
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    lay = layout(Gemma3TextConfig(sliding_window=4, layer_types=types, **SMALL))
    assert lay.layer_types == (SLIDING, FULL)
    assert lay.sliding_window == 4


def test_gemma3_composite_config_uses_text_config():
    cfg = Gemma3Config(
        text_config=dict(sliding_window=5, layer_types=["full_attention", "sliding_attention"] * 2, **SMALL)
    )
    lay = layout(cfg)
    assert lay.layer_types == (FULL, SLIDING)
    assert lay.sliding_window == 5


def test_qwen2_sliding_layers():
    cfg = Qwen2Config(use_sliding_window=True, sliding_window=4, max_window_layers=1, **SMALL)
    assert set(cfg.layer_types) == {FULL, SLIDING}
    lay = layout(cfg)
    assert lay.layer_types == tuple(dict.fromkeys(cfg.layer_types))
    assert set(lay.layer_types) == {FULL, SLIDING}
    assert lay.sliding_window == 4


def test_qwen2_without_sliding_is_full():
    lay = layout(Qwen2Config(use_sliding_window=False, sliding_window=4, **SMALL))
    assert lay.layer_types == (FULL,)
    assert lay.sliding_window is None


def test_plain_object_config():
    """Configs without get_text_config are read directly."""
    assert layout(SimpleNamespace(sliding_window=None)).layer_types == (FULL,)
    lay = layout(SimpleNamespace(sliding_window=3, layer_types=[SLIDING, SLIDING]))
    assert (lay.layer_types, lay.sliding_window) == ((SLIDING,), 3)


def test_unsupported_layer_type():
    with pytest.raises(UnsupportedAttention, match="chunked_attention"):
        layout(LlamaConfig(layer_types=["chunked_attention"] * 4, **SMALL))


def test_chunk_size_without_layer_types_is_unsupported():
    with pytest.raises(UnsupportedAttention, match="chunked_attention"):
        layout(SimpleNamespace(attention_chunk_size=16))


def test_sliding_layers_without_window():
    with pytest.raises(UnsupportedAttention, match="without a sliding_window size"):
        layout(Gemma3TextConfig(sliding_window=None, layer_types=[SLIDING, FULL, SLIDING, FULL], **SMALL))


# --- build ------------------------------------------------------------------------------------


def reference_allowed(past_len: int, positions: list[int], visible: list[list[bool]], window: int | None):
    """allowed[i][j] for query i over keys 0..past_len+q-1, element by element."""
    q = len(positions)
    key_pos = list(range(past_len)) + positions
    out = []
    for i in range(q):
        row = []
        for j in range(past_len + q):
            ok = True if j < past_len else visible[i][j - past_len]
            if window is not None and not key_pos[j] > positions[i] - window:
                ok = False
            row.append(ok)
        out.append(row)
    return out


def check_mask(mask: torch.Tensor, allowed: list[list[bool]], dtype: torch.dtype):
    q, kv = len(allowed), len(allowed[0])
    assert mask.shape == (1, 1, q, kv)
    assert mask.dtype == dtype
    minimum = torch.finfo(dtype).min
    got = mask[0, 0].float().tolist()
    for i in range(q):
        for j in range(kv):
            expected = 0.0 if allowed[i][j] else minimum
            assert got[i][j] == expected, (i, j)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("past_len, q", [(0, 7), (5, 6), (9, 1)])
def test_causal_full(dtype, past_len, q):
    lay = layout(LlamaConfig(**SMALL), dtype)
    positions = torch.arange(past_len, past_len + q)
    vis = causal_visibility(q, "cpu")
    assert vis.tolist() == [[j <= i for j in range(q)] for i in range(q)]
    mask = lay.build(past_len, positions, vis)
    check_mask(mask, reference_allowed(past_len, positions.tolist(), vis.tolist(), None), dtype)


@pytest.mark.parametrize("past_len, q", [(0, 9), (6, 5), (10, 1), (3, 12)])
def test_causal_sliding(past_len, q):
    """A query at position p sees key position j only when j > p - window (and causally)."""
    lay = layout(MistralConfig(sliding_window=4, **SMALL))
    positions = torch.arange(past_len, past_len + q)
    vis = causal_visibility(q, "cpu")
    mask = lay.build(past_len, positions, vis)
    allowed = reference_allowed(past_len, positions.tolist(), vis.tolist(), 4)
    check_mask(mask, allowed, torch.float32)
    # Spot-check the rule itself: the last query sees exactly `window` keys (itself and 3 before).
    if past_len + q >= 4:
        assert sum(allowed[-1]) == 4


def _tree_inputs(spec: TreeSpec, past_len: int):
    buf = TreeBuffers.build(spec)
    return past_len + buf.depths, buf.ancestor_mask


@pytest.mark.parametrize(
    "spec", [PRESETS["paper"], TreeSpec.from_paths("s", [[0], [1], [0, 0], [1, 0], [0, 0, 0]])], ids=lambda s: s.name
)
@pytest.mark.parametrize("past_len", [0, 3, 20])
def test_tree_full(spec, past_len):
    """Tree verification: all cached keys plus the node's ancestors (and itself)."""
    lay = layout(LlamaConfig(**SMALL))
    positions, vis = _tree_inputs(spec, past_len)
    mask = lay.build(past_len, positions, vis)
    check_mask(mask, reference_allowed(past_len, positions.tolist(), vis.tolist(), None), torch.float32)
    # Siblings never see each other.
    assert mask[0, 0, 1, past_len + 2] == torch.finfo(torch.float32).min


@pytest.mark.parametrize("past_len", [0, 2, 15])
def test_tree_sliding(past_len):
    """Sliding window on a tree uses node positions (past_len + depth), not node indices."""
    spec = PRESETS["paper"]
    lay = layout(MistralConfig(sliding_window=4, **SMALL))
    positions, vis = _tree_inputs(spec, past_len)
    mask = lay.build(past_len, positions, vis)
    check_mask(mask, reference_allowed(past_len, positions.tolist(), vis.tolist(), 4), torch.float32)


def test_mixed_layout_returns_dict():
    """Gemma-3-style mixed layers: a dict with a full mask and a sliding mask, each per its rule."""
    types = [SLIDING, FULL, SLIDING, FULL]
    lay = layout(Gemma3TextConfig(sliding_window=3, layer_types=types, **SMALL), torch.bfloat16)
    spec = TreeSpec.from_paths("s", [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0]])
    past_len = 6
    positions, vis = _tree_inputs(spec, past_len)
    masks = lay.build(past_len, positions, vis)
    assert isinstance(masks, dict)
    assert set(masks) == {"full_attention", "sliding_attention"}
    check_mask(
        masks["full_attention"], reference_allowed(past_len, positions.tolist(), vis.tolist(), None), torch.bfloat16
    )
    check_mask(
        masks["sliding_attention"], reference_allowed(past_len, positions.tolist(), vis.tolist(), 3), torch.bfloat16
    )
    assert not torch.equal(masks["full_attention"], masks["sliding_attention"])

    # Causal prefill through the same layout.
    q = 8
    positions = torch.arange(q)
    masks = lay.build(0, positions, causal_visibility(q, "cpu"))
    check_mask(
        masks["sliding_attention"],
        reference_allowed(0, list(range(q)), causal_visibility(q, "cpu").tolist(), 3),
        torch.bfloat16,
    )
