"""The command line starts at once: building the app, every --help and --version import neither
torch, transformers nor the server's FastAPI/uvicorn (they load when a command runs). Checked in
a fresh interpreter, since this test process has imported everything already."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "prompt_toolkit")

PROBE = """
import json, sys
from typer.testing import CliRunner
from tr_cli.cli import app
result = CliRunner().invoke(app, json.loads(sys.argv[1]), prog_name="tr")
heavy = [name for name in json.loads(sys.argv[2]) if name in sys.modules]
print(json.dumps({"exit": result.exit_code, "heavy": heavy, "output": result.output[:200]}))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["generate", "--help"],
        ["chat", "--help"],
        ["bench", "--help"],
        ["serve", "--help"],
        ["matrix", "--help"],
        ["matrix", "inspect", "--help"],
        ["matrix", "init", "--help"],
    ],
    ids=" ".join,
)
def test_help_and_version_load_no_heavy_module(args):
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    outcome = json.loads(probe.stdout.splitlines()[-1])
    assert outcome["exit"] == 0, outcome["output"]
    assert outcome["heavy"] == [], f"tr {' '.join(args)} imported {outcome['heavy']}"
