"""Help texts reach the user whole: Typer renders them through Rich markup, where `[word]` is a
style tag and vanishes (`tr-cli[plot]` printed as `tr-cli`) unless written `\\[word]`."""

import re

import click
import typer
from typer.testing import CliRunner

from tr_cli.cli import app

UNESCAPED_TAG = re.compile(r"(?<!\\)\[[A-Za-z][^\]\s]*\]")


def walk(command: click.Command, path: tuple[str, ...] = ()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():  # a group (tr's is not a click.Group)
        yield from walk(sub, (*path, name))


def test_no_help_text_holds_a_tag_rich_would_eat():
    eaten, commands = [], list(walk(typer.main.get_command(app)))
    assert {("bench",), ("matrix", "inspect")} <= {path for path, _ in commands}
    for path, command in commands:
        texts = [command.help or ""] + [getattr(param, "help", None) or "" for param in command.params]
        eaten += [f"tr {' '.join(path)}: {tag}" for text in texts for tag in UNESCAPED_TAG.findall(text)]
    assert not eaten, f"write these as \\[...]: {eaten}"


def test_the_plot_extra_is_named_in_bench_help():
    result = CliRunner().invoke(app, ["bench", "--help"], prog_name="tr", env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert "tr-cli[plot]" in result.output
