"""One MODEL convention (cli/options.py): every command that takes a model takes -m/--model, the
positional MODEL too where there is one; both given and different is one line, before anything
loads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tr_cli.cli import app

runner = CliRunner()

MODEL_COMMANDS = [
    ["generate"],
    ["chat"],
    ["serve"],
    ["bench"],
    ["matrix", "init"],
    ["matrix", "inspect"],
    ["matrix", "export"],
    ["matrix", "import"],
]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=" ".join)
def test_every_model_command_takes_the_model_as_an_option(command):
    out = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "-m, --model" in out.output, out.output


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "smollm2", "-m", "other.gguf", "-p", "hi"],
        ["chat", "smollm2", "--model", "other.gguf"],
        ["serve", "smollm2", "-m", "other.gguf"],
        ["matrix", "init", "smollm2", "-m", "other.gguf"],
        ["matrix", "inspect", "smollm2", "-m", "other.gguf"],
        ["matrix", "export", "smollm2", "out.safetensors", "-m", "other.gguf"],
        ["matrix", "import", "smollm2", "in.safetensors", "-m", "other.gguf"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_two_different_models_are_one_line(home, args):
    out = runner.invoke(app, args)
    assert out.exit_code == 1, out.output
    assert out.output.strip().splitlines() == ["tr: error: MODEL smollm2 and --model other.gguf: two models; give one"]


def test_the_same_model_twice_is_that_model(home, tmp_path):
    """The option alone, or both naming the same model, reach the model resolver as that model."""
    missing = str(tmp_path / "missing.gguf")
    for args in (["-m", missing], [missing, "--model", missing]):
        out = runner.invoke(app, ["generate", *args, "-p", "hi"])
        assert out.exit_code == 1 and f"model {missing}" in out.output and "no such file" in out.output, out.output
    out = runner.invoke(app, ["matrix", "export", "-m", missing, str(tmp_path / "out.safetensors")])
    assert out.exit_code == 1 and missing in out.output, out.output
