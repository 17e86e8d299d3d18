"""Real client libraries against a real `tr serve` (a subprocess) on tiny random-weight models:
one whose chat template speaks Hermes-style tools with `<tool_call>` as single tokens (as
Qwen2.5's), one whose template has no tools (the generic format). The tests check the protocol
(each call comes back as a parsed tool call or schema-valid output), never the answers' quality.
The libraries are the `clients` extra (pyproject.toml); a test whose library is absent is skipped
saying so. Each server starts once per run and serves every module."""

from __future__ import annotations

import subprocess

import pytest

from client_server import start_server


@pytest.fixture(scope="session", params=["hermes", "generic"])
def tr_server(request, tmp_path_factory, new_home_dir):
    """`tr serve` on the tiny Hermes-template model, then on one whose template has no tools (SmolLM2's)."""
    from tool_models import tool_checkpoint

    directory = tmp_path_factory.mktemp(f"serve-{request.param}")
    tokenizer_dir = request.getfixturevalue("smollm2_tokenizer_dir")
    model_dir = tool_checkpoint(directory / "model", tokenizer_dir, request.param == "hermes", ends_values=True)
    proc, server = start_server(model_dir, request.param, new_home_dir(directory / "home"), directory / "serve.log")
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@pytest.fixture(scope="session")
def new_home_dir(gguf_cache):
    from conftest import new_home

    return lambda path: new_home(path, gguf_cache)
