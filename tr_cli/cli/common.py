"""What every command shares: option types, one-line user errors, loading with a spinner."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import typer
from rich.console import Console

from ..errors import UserError
from ..models import DEFAULT_MODEL, LoadedModel, load_model

stderr = Console(stderr=True, highlight=False, soft_wrap=True)

ModelArg = typer.Argument(
    None, help=f"Packaged model name ({DEFAULT_MODEL}), a .gguf file, a checkpoint directory or a cached Hugging Face id."
)
DeviceOpt = typer.Option("auto", "--device", help="auto, cpu, cuda or mps.")
DtypeOpt = typer.Option("auto", "--dtype", help="auto (bf16 on CUDA and bf16-capable CPUs, else float32), float32, bfloat16, float16.")
TreeOpt = typer.Option("paper", "--tree", help="Draft tree: a preset (paper) or a JSON spec file.")


def fail(message: str) -> typer.Exit:
    """Print one line to stderr; the caller raises the returned Exit (code 1)."""
    stderr.print(f"[bold red]tr: error:[/] {message}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(1)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """User mistakes become one line and exit 1; Ctrl-C exits 130 quietly."""
    try:
        yield
    except UserError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        stderr.print("interrupted")
        raise typer.Exit(130) from None


def load_with_progress(model: str | None, device: str, dtype: str) -> LoadedModel:
    """Load the model while a spinner on stderr says what is happening."""
    if not sys.stderr.isatty():
        return load_model(model, device, dtype, status=lambda message: stderr.print(f"[dim]{message}…[/]"))
    with stderr.status("Resolving model…") as spinner:
        return load_model(model, device, dtype, status=lambda message: spinner.update(f"{message}…"))
