"""Set-up shared by the decoding commands: open the engine with progress on stderr, show its
banner and warnings, and save its matrix with a warning (never an error) when that fails."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape

from ..engine.choices import EngineOptions
from ..engine.engine import Engine
from ..store.hot_matrix import HotMatrix
from .console import note, stderr, warn


def status_line(message: str) -> None:
    """A long step as a dim line: 'Loading smollm2 (float32, cpu)…'."""
    note(f"{message}…")


@contextlib.contextmanager
def progress() -> Iterator:
    """A status callback for long set-up steps: a spinner in a terminal, dim lines otherwise."""
    if not sys.stderr.isatty():
        yield status_line
        return
    with stderr.status("Resolving model…") as spinner:
        yield lambda message: spinner.update(f"{escape(message)}…")


def open_engine(options: EngineOptions, matrix: bool = True, decoder: bool = True, banner: bool = True) -> Engine:
    """Load the model, open its matrix and build its decoder, saying what happens; then the
    banner (what runs) and any warnings."""
    with progress() as status:
        engine = Engine.open(options, status=status, matrix=matrix, decoder=decoder)
    engine.status = status_line  # later calibrations (bench variants)
    if banner:
        for line in engine.banner():
            note(line)
    for message in engine.warnings:
        warn(message)
    return engine


def save_matrix(hot: HotMatrix, console: Console = stderr, announce: bool = True) -> None:
    """Write the matrix back; a failure is a one-line warning, never a lost result."""
    try:
        rows = hot.save()
    except Exception as exc:  # noqa: BLE001 - whatever fails, the text and the conversation are kept
        warn(f"could not save the matrix to {hot.path}: {exc}", console)
        return
    if rows and announce:
        note(f"matrix: {rows:,} rows saved to {hot.path}", console)
