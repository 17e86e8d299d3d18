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
