"""Starting `tr serve` for tests/clients/ (a subprocess on a tiny model) and finding the client
libraries there (the `clients` extra; a test whose library is absent is skipped saying so)."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"tr serve: listening on (http://\S+/v1) \(model '([^']+)'")
START_TIMEOUT = 180
MAX_TOKENS = 96  # the server's default reply length: clients that send no max_tokens get this
# The paper's tree: no step-cost measurement at start; nothing saved.
SERVE_ARGS = ("--dtype", "float32", "--max-new-tokens", str(MAX_TOKENS), "--tree", "paper", "--no-save")


def needs(module: str):
    """The client library `module`, or the test skipped saying how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"{module} is not installed ({exc}); pip install -e '.[clients]'")


@dataclass
class TrServer:
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the id the server gives its model
    kind: str  # "hermes" or "generic"
    log: Path

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(model_dir: Path, kind: str, home: Path, log: Path):
    """`tr serve MODEL_DIR` on a free port, waited for until it listens: (process, server)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TR_API_KEY")}
    env.update(HF_HUB_OFFLINE="1", TR_HOME=str(home), NO_COLOR="1", COLUMNS="200")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tr_cli", "serve", str(model_dir), *SERVE_ARGS, "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        text = log.read_text(errors="replace")
        found = LISTENING.search(text)
        if found:
            return proc, TrServer(found.group(1), found.group(2), kind, log)
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"tr serve did not start (status {proc.poll()}); its output:\n{text}")
        time.sleep(0.2)
