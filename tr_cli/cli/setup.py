"""Set-up shared by the decoding commands: open the engine with progress on stderr, show its
banner and warnings, and save its hot state with a warning (never an error) when that fails."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..core.wording import counted
from ..engine.engine import Engine
from ..engine.options import DecodingOptions
from ..errors import StoreError
from ..store.hot_matrix import HotMatrix, Saved
from ..store.recycled_file import recycled_store_path
from .console import debugging, note, stderr, warn
from .interrupts import held_back


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


class StartClock:
    """TR_DEBUG=1: how long each set-up step took (the engine's phases, and within them the
    status messages: hashing, converting, quantizing, measuring), after the time the process
    spent starting (Python and the imports)."""

    def __init__(self, status: Callable[[str], None]) -> None:
        self.status = status
        self.steps: list[tuple[str, float]] = [("before loading (Python, imports, checks)", process_age())]
        self.current: str | None = None
        self.since = time.perf_counter()

    def __call__(self, message: str) -> None:
        self.mark(message)
        self.status(message)

    def mark(self, name: str) -> None:
        self._close()
        self.current = name

    def _close(self) -> None:
        now = time.perf_counter()
        if self.current is not None:
            self.steps.append((self.current, now - self.since))
        self.current, self.since = None, now

    def summary(self) -> str:
        self._close()
        parts = [f"{name} {seconds:.2f} s" for name, seconds in self.steps if seconds == seconds]  # NaN: unknown
        return "start: " + " · ".join(parts)


def process_age() -> float:
    """Seconds since this process started (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in ticks
    except (OSError, ValueError, IndexError):
        return float("nan")


def open_engine(options: DecodingOptions, matrix: bool = True, decoder: bool = True, banner: bool = True) -> Engine:
    """Load the model, open its matrix and build its decoder, saying what happens; then the
    banner (what runs) and any warnings. With TR_DEBUG=1, where the start's time went."""
    with progress() as shown:
        clock = StartClock(shown) if debugging() else None
        status, phase = (clock, clock.mark) if clock else (shown, lambda name: None)
        engine = Engine.open(options, status=status, matrix=matrix, decoder=decoder, phase=phase)
    if clock is not None:
        note(clock.summary())
    engine.status = status_line  # later calibrations (bench variants)
    engine.warn = warn
    if engine.hot is not None:
        engine.hot.waiting = note  # a save held up by another process's lock says so
    if banner:
        for line in engine.banner():
            note(line)
    for message in engine.warnings:
        warn(message)
    return engine


def save_state(engine: Engine, console: Console = stderr, announce: bool = True, end_conversation: bool = True) -> None:
    """Engine.save (the conversation joins the store, then matrix, store and statistics are
    written); a failure is a one-line warning, never a lost result. A chat's periodic save passes
    `end_conversation=False`: the conversation goes on."""
    if engine.hot is not None:
        with held_back():  # a signal now acts once the save is done (the save's lock wait is bounded)
            _report(lambda: engine.save(end_conversation), engine.hot, console, announce)


def _report(save: Callable[[], Saved], hot: HotMatrix, console: Console, announce: bool) -> None:
    try:
        saved = save()
    except StoreError as exc:  # names the parts that failed; the others were saved
        warn(str(exc), console)
        return
    except Exception as exc:  # noqa: BLE001 - whatever fails, the text and the conversation are kept
        warn(f"could not save the matrix to {hot.path}: {exc}", console)
        return
    for kept in saved.kept_aside:
        warn(f"an unreadable file was met while saving; it is kept as {kept}", console)
    if not announce:
        return
    if saved.rows:
        note(f"matrix: {saved.rows:,} rows saved to {hot.path}", console)
    if saved.documents:
        where = recycled_store_path(hot.path)
        conversations = counted(saved.documents, "conversation")
        note(f"recycled store: {conversations} ({saved.tokens:,} tokens) saved to {where}", console)
