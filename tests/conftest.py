"""Shared fixtures. Tests run offline (HF_HUB_OFFLINE=1) with TR_HOME in a temporary directory.

Layout: unit/ mirrors the package, integration/ runs several parts together on real (tiny or
packaged) models, e2e/ runs the command line as a user does. Tests marked `slow` (the packaged
model, subprocesses, statistical sampling checks; everything in e2e/) are left out by
`make test-fast`; `make test` runs them all.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

from tr_cli.store.paths import cache_dir

# The cache tr uses outside the tests, where `make install` builds the kernels ahead.
INSTALLED_CACHE = cache_dir()
# Nothing may come from the hub, and nothing of ours may touch the user's real data dir.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TR_HOME", tempfile.mkdtemp(prefix="tr-test-home-"))
TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # tiny_models

import pytest  # noqa: E402

SESSION_CACHE = cache_dir()  # read before any test moves TR_HOME
SLOW_FIXTURES = {"smollm2_fp32", "smollm2_checkpoint"}


def pytest_sessionstart(session):
    """This run's kernels start as a copy of the build `make install` made (the same folder name:
    the same sources, torch, compiler and flags; a damaged copy is built again on load), read
    only: compiling them again costs a minute on 2 cores. The tests of the build itself compile
    their own."""
    from tr_cli.models import native_kernels

    if native_kernels.unavailable() is not None or INSTALLED_CACHE == SESSION_CACHE:
        return
    built = native_kernels.build_folder(INSTALLED_CACHE / "kernels")
    target = native_kernels.build_folder(SESSION_CACHE / "kernels")
    if built.is_dir() and not target.exists():
        shutil.copytree(built, target, ignore=shutil.ignore_patterns(".build-*"))


def pytest_collection_modifyitems(config, items):
    """Everything in e2e/ and everything on the packaged model is slow."""
    for item in items:
        in_e2e = "e2e" in Path(str(item.fspath)).relative_to(TESTS).parts
        if in_e2e or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def gguf_cache() -> Path:
    """Where this run keeps GGUFs' converted tokenizers and configs: converted once per run,
    whatever TR_HOME a test uses."""
    path = SESSION_CACHE / "gguf"
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_home(path: Path, gguf_cache: Path) -> Path:
    """A fresh TR_HOME whose GGUF tokenizer/config cache and compiled kernels are the run's (data
    starts empty): each is made once per run, whatever TR_HOME a test or its subprocess uses."""
    (path / "cache").mkdir(parents=True, exist_ok=True)
    for name, target in (("gguf", gguf_cache), ("kernels", SESSION_CACHE / "kernels")):
        target.mkdir(parents=True, exist_ok=True)
        link = path / "cache" / name
        if not link.exists():
            link.symlink_to(target, target_is_directory=True)
    return path


@pytest.fixture(scope="session")
def tr_kernels() -> Path:
    """tr's int4/int8 kernels, compiled once per run into the run's cache and loaded; skipped on a
    machine where they cannot run (no AVX2, no C++ compiler), saying why."""
    from tr_cli.models import native_kernels

    reason = native_kernels.unavailable()
    if reason is not None:
        pytest.skip(f"tr's kernels cannot run here: {reason}")
    return native_kernels.load(SESSION_CACHE / "kernels")


@pytest.fixture()
def home(tmp_path, monkeypatch, gguf_cache) -> Path:
    """A fresh TR_HOME for this test (also for the subprocesses it starts)."""
    path = new_home(tmp_path / "home", gguf_cache)
    monkeypatch.setenv("TR_HOME", str(path))
    return path


@pytest.fixture(scope="session")
def smollm2_fp32(gguf_cache):
    """The packaged SmolLM2-135M-Instruct, float32 on the CPU (its GGUF dequantized at load)."""
    from tr_cli.models import Runtime, load_model

    return load_model(None, Runtime.resolve("cpu", "float32"), cache=gguf_cache.parent)


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_fp32, gguf_cache, tmp_path_factory) -> Path:
    """The packaged model as a transformers checkpoint directory (config, safetensors, tokenizer):
    its float32 load saved once per run, beside the tokenizer files converted from the GGUF."""
    from tr_cli.models.gguf_cache import MANIFEST, gguf_side_files

    directory = tmp_path_factory.mktemp("smollm2-checkpoint")
    side_files = gguf_side_files(smollm2_fp32.source.path, gguf_cache, lambda message: None)
    for source in side_files.iterdir():
        if source.name != MANIFEST:
            shutil.copy(source, directory / source.name)
    smollm2_fp32.model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer (49,152 ids, ChatML template) read straight from the packaged GGUF,
    without converting the weights. Reading it takes seconds, so it is kept between runs in the
    system's temp dir, keyed by the GGUF file and the transformers version."""
    import hashlib

    import transformers
    from transformers import AutoTokenizer

    from tr_cli.models import resolve_model

    gguf = resolve_model(None).path
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    directory = (
        Path(tempfile.gettempdir())
        / "tr-test-cache"
        / f"smollm2-tokenizer-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    )
    if not (directory / "tokenizer.json").is_file():
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=directory.parent))
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
        try:
            staging.rename(directory)  # whole or absent, also with two runs at once
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return directory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A random-weight 2-layer Llama checkpoint speaking through SmolLM2's tokenizer (49,152 ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=2,
        bos_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    for source in smollm2_tokenizer_dir.iterdir():
        shutil.copy(source, directory / source.name)
    return directory


@pytest.fixture(scope="session")
def tiny_hermes_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A random-weight 2-layer Llama whose chat template speaks Hermes-style tools, its
    `<tool_call>` tags single added tokens (as Qwen2.5's are; tests/tool_models.py)."""
    from tool_models import hermes_checkpoint

    return hermes_checkpoint(tmp_path_factory.mktemp("tiny-hermes") / "model", smollm2_tokenizer_dir)


@pytest.fixture()
def small_context_model(tiny_llama_dir, tmp_path):
    """A factory: the tiny checkpoint copied with a context of `positions` tokens
    (max_position_embeddings), for running out of context fast."""
    import json

    def copy(positions: int) -> Path:
        directory = tmp_path / f"small-context-{positions}"
        shutil.copytree(tiny_llama_dir, directory)
        config = json.loads((directory / "config.json").read_text())
        config["max_position_embeddings"] = positions
        (directory / "config.json").write_text(json.dumps(config))
        return directory

    return copy
