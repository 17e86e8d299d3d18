"""The families past Llama read from a GGUF (tests/tiny_gguf.py writes one per architecture): the
file's blocks straight into tr's kernels, the model on the fused layers and the whole-step kernel, and
Token Recycling (the paper's tree) equal to `generate` on it, token for token."""

import pytest
from gguf import GGMLQuantizationType as T
from tiny_gguf import default_types, write_tiny_gguf

from tr_cli.core import PRESETS, StopCondition, TokenRecyclingDecoder
from tr_cli.core.forward import WHOLE_STEP, LlamaFamilyForward
from tr_cli.models import Runtime, load_model
from tr_cli.models.fused_layers import FusedAttention

from tiny_models import EOS, random_prompt, reference, tiny_model

pytestmark = pytest.mark.usefixtures("tr_kernels")

# Per family, the file's types (matrices, token embedding) and the mode it is read in.
CASES = [
    ("qwen3-gguf", T.Q4_0, T.Q8_0, "int4"),
    ("phi3-gguf", T.Q8_0, T.Q8_0, "int8"),
    ("gemma3", T.Q4_1, T.Q8_0, "int4"),
    ("gemma2", T.Q5_0, T.Q8_0, "int8"),
]


@pytest.mark.parametrize(("arch", "matrices", "embedding", "weights"), CASES, ids=[case[0] for case in CASES])
def test_a_family_read_from_a_gguf_decodes_as_generate_does(tmp_path, arch, matrices, embedding, weights):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", tiny_model(arch), default_types(matrices, embedding))
    model = load_model(str(path), Runtime.resolve("cpu", "float32", weights), cache=tmp_path / "cache").model
    assert all(isinstance(layer.self_attn, FusedAttention) for layer in model.model.layers)
    assert hasattr(model, WHOLE_STEP)
    decoder = TokenRecyclingDecoder(model, tree=PRESETS["paper"])
    assert isinstance(decoder.forward_pass, LlamaFamilyForward) and decoder.forward_pass.whole_step is not None
    for seed, (length, budget) in enumerate([(9, 16), (33, 30)]):
        ids = random_prompt(length, 60 + seed)
        decoder.reset()
        assert decoder.generate(ids, StopCondition.build(budget, [EOS])).tokens == reference(model, ids, budget)
