"""The `tr` command line: one Typer app, one module per command."""

from __future__ import annotations

import platform
from typing import Annotated

import typer

from .. import __version__
from .bench import bench
from .chat import chat
from .errors import ErrorBoundary
from .generate import generate
from .matrix import app as matrix_app
from .serve import serve

app = typer.Typer(
    cls=ErrorBoundary,
    name="tr",
    help="Token Recycling: faster lossless decoding (greedy or sampled) for any transformers model, no training.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=True,
    # Plain help (click's formatter): Rich's help panels cost ~0.1 s of imports and rendering per
    # --help, a third of a start that should feel instant.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


def version_text() -> str:
    """tr's version, then what its numbers depend on: torch, transformers, Python and the CPU
    (read from the installed packages' metadata and /proc: nothing heavy is imported)."""
    from importlib import metadata

    from ..models.cpu import cpu_isa, cpu_name

    def installed(name: str) -> str:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return f"{name} (not installed)"

    stack = " · ".join([installed("torch"), installed("transformers"), f"Python {platform.python_version()}"])
    return f"tr {__version__}\n{stack}\nCPU: {cpu_name()} ({cpu_isa()})"


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Token Recycling: faster lossless decoding (greedy or sampled) for any transformers model, no training."""


app.command()(chat)
app.command()(generate)
app.command()(bench)
app.command()(serve)
app.add_typer(matrix_app, name="matrix")


def main() -> None:
    import os
    import sys

    # `token-recycling` is its own program name: usage lines and _TOKEN_RECYCLING_COMPLETE.
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    app(prog_name="token-recycling" if name == "token-recycling" else "tr")
