"""The `tr` command line: one Typer app, one module per command."""

from __future__ import annotations

import typer

from .. import __version__
from .generate import generate

app = typer.Typer(
    name="tr",
    help="Token Recycling: faster greedy decoding for any transformers model, no training.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=True,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Token Recycling: faster greedy decoding for any transformers model, no training."""


app.command()(generate)


def main() -> None:
    app(prog_name="tr")
