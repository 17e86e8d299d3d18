"""The families past Llama on tr's kernels, as a user loads them: a checkpoint directory opened by
`load_model` with int4/int8 weights runs on the fused layers and the whole-step kernel, and Token
Recycling (the paper's tree) gives `generate`'s tokens on that very model, token for token.

Qwen3 (per-head q/k norms), Phi-3 (q/k/v and gate/up one projection in the checkpoint, rotary over
half a head), Gemma 3 (sandwich norms, local and global rotary bases, sliding layers) and Gemma 2
(attention and final-logit soft-capping), as tiny random-weight models saved with save_pretrained;
and Gemma 3 with its real 262,144-token vocabulary, for the head.
"""

from pathlib import Path

import pytest
import torch

from tr_cli.core import PRESETS, StopCondition, TokenRecyclingDecoder
from tr_cli.core.forward import WHOLE_STEP, LlamaFamilyForward
from tr_cli.models import Runtime, load_model
from tr_cli.models.fused_layers import FusedAttention, FusedMLP, FusedRMSNorm
from tr_cli.store.paths import cache_dir

from tiny_models import EOS, random_prompt, reference, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("tr_kernels")

FAMILIES = ["qwen3", "phi3", "gemma3", "gemma2"]


def saved(arch: str, directory: Path) -> Path:
    tiny_model(arch).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def loaded_on_the_fused_path(directory: Path, mode: str) -> torch.nn.Module:
    """The checkpoint loaded as `tr --weights MODE` loads it, checked to be on the fused path all the
    way (so that a silent fallback to the model's own modules fails here)."""
    model = load_model(str(directory), Runtime.resolve("cpu", "auto", mode), cache=cache_dir()).model
    layers = model.model.layers
    assert all(isinstance(layer.self_attn, FusedAttention) for layer in layers)
    assert all(isinstance(layer.mlp, FusedMLP) and isinstance(layer.input_layernorm, FusedRMSNorm) for layer in layers)
    assert isinstance(model.model.norm, FusedRMSNorm) and hasattr(model, WHOLE_STEP)
    return model


def decoded(model: torch.nn.Module, cases: list[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """(Token Recycling's tokens, generate's) per (prompt length, budget); the decoder checked to run
    the direct forward's whole step, and its drafts to be accepted somewhere (trees verified)."""
    decoder = TokenRecyclingDecoder(model, tree=PRESETS["paper"])
    assert isinstance(decoder.forward_pass, LlamaFamilyForward)
    assert decoder.forward_pass.whole_step is getattr(model, WHOLE_STEP)
    pairs, accepted = [], 0
    for seed, (length, budget) in enumerate(cases):
        ids = random_prompt(length, 50 + seed)
        decoder.reset()
        result = decoder.generate(ids, StopCondition.build(budget, [EOS]))
        pairs.append((result.tokens, reference(model, ids, budget)))
        accepted += result.stats.step_tokens - result.stats.steps
    assert accepted > 0, "no draft was ever accepted: the tree path was not exercised"
    return pairs


@pytest.mark.parametrize("mode", ["int4", "int8"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_a_family_decodes_on_the_fused_path_as_generate_does(arch, mode, tmp_path):
    model = loaded_on_the_fused_path(saved(arch, tmp_path / arch), mode)
    for got, want in decoded(model, [(9, 16), (33, 30)]):  # the sliding window is 12
        assert got == want


def test_gemma3_with_its_262k_vocabulary_decodes_as_generate_does(tmp_path):
    model = loaded_on_the_fused_path(saved("gemma3-262k", tmp_path / "gemma3"), "int4")
    assert model.get_output_embeddings().out_features == 262144
    for got, want in decoded(model, [(20, 20)]):
        assert got == want
