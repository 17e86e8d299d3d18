"""Help is plain text (click's formatter, not Rich's panels, which cost ~0.1 s of every --help),
and reaches the user whole: no help text holds Rich markup, which plain help would print as is."""

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from tr_cli.cli import app

MARKUP = re.compile(r"\\\[|\[/?(?:bold|italic|dim|underline|red|green|yellow|blue|cyan|magenta|b|i|u)\]")


def walk(command: click.Command, path: tuple[str, ...] = ()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():  # a group (tr's is not a click.Group)
        yield from walk(sub, (*path, name))


def test_no_help_text_holds_rich_markup():
    found, commands = [], list(walk(typer.main.get_command(app)))
    assert {("bench",), ("matrix", "inspect")} <= {path for path, _ in commands}
    for path, command in commands:
        texts = [command.help or ""] + [getattr(param, "help", None) or "" for param in command.params]
        found += [f"tr {' '.join(path)}: {tag}" for text in texts for tag in MARKUP.findall(text)]
    assert not found, f"plain help would print these as they are: {found}"


@pytest.mark.parametrize("args", [["--help"], ["bench", "--help"], ["matrix", "inspect", "--help"]], ids=" ".join)
def test_help_is_plain(args):
    result = CliRunner().invoke(app, args, prog_name="tr", env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert result.output.startswith("Usage: tr")
    assert not set("╭╮╰╯│") & set(result.output), "Rich's help panels are back"


def test_the_plot_extra_is_named_in_bench_help():
    result = CliRunner().invoke(app, ["bench", "--help"], prog_name="tr", env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert "tr-cli[plot]" in result.output
