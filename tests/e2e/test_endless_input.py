"""Endless input (43.4): /dev/zero and /dev/urandom as a prompt, a prompt file, a report, a schema
or a corpus are refused in one line after a bounded read, before any model loads (they used to
be read whole: GBs in seconds, Ctrl-C and SIGTERM ignored meanwhile)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tr_cli.cli import app

BIN = Path(sys.executable).parent
runner = CliRunner()


def _capped() -> None:
    """A child that reads without bound fails on memory instead of filling the machine's."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize(
    "args", [["generate", "-p", "-"], ["chat"], ["chat", "--each-line"]], ids=["generate", "chat", "each-line"]
)
def test_endless_standard_input_is_one_line(home, args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TR_HOME": str(home)}
    with open("/dev/zero", "rb") as zero:
        out = subprocess.run(
            [str(BIN / "tr"), *args], stdin=zero, capture_output=True, env=env, timeout=120, preexec_fn=_capped
        )
    lines = out.stderr.decode().strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert "standard input holds more than 8 MB, the most tr reads as one message" in lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (["bench", "/dev/zero"], "/dev/zero: more than the 64 MB tr reads from one file"),
        (["bench", "/dev/urandom"], "/dev/urandom: cannot read it as UTF-8 text"),
        (["bench", "--from-report", "/dev/zero"], "/dev/zero: more than the 64 MB"),
        (["generate", "--schema", "/dev/zero", "-p", "hi"], "--schema /dev/zero: more than the 64 MB"),
        (["matrix", "init", "--from", "/dev/zero"], "--from /dev/zero: more than the 64 MB"),
    ],
)
def test_an_endless_file_is_one_line_before_the_model_loads(home, args, words):
    out = runner.invoke(app, args)
    assert out.exit_code == 1, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], out.output
