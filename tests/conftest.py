import os
import sys
import tempfile
from pathlib import Path

# Nothing may come from the hub, and nothing of ours may touch the user's real data dir.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TR_HOME", tempfile.mkdtemp(prefix="tr-test-home-"))
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_fp32():
    """The packaged SmolLM2-135M-Instruct, float32 on the CPU (converted once per session)."""
    from tr_cli.models import load_model

    return load_model(None, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_fp32) -> Path:
    """The directory of the converted checkpoint (config, safetensors, tokenizer)."""
    from tr_cli.models import _gguf_checkpoint

    return _gguf_checkpoint(smollm2_fp32.source.path, lambda message: None)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_checkpoint) -> Path:
    """A random-weight 2-layer Llama checkpoint speaking through SmolLM2's tokenizer (49,152 ids)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, eos_token_id=2, bos_token_id=1)
    LlamaForCausalLM(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_checkpoint / name).exists():
            shutil.copy(smollm2_checkpoint / name, directory / name)
    return directory
