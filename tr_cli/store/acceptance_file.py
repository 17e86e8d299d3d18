"""The acceptance statistics learned with a matrix, kept beside it (`<matrix>.accept.json`), so a
hot start also starts with a tree fitted to how well that matrix drafts.

Counts add up: a save merges what this process counted since it loaded (or last saved) onto what
the file holds by then, under the file's lock, so processes sharing a matrix keep each other's
counts as they keep each other's rows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from ..core.design.acceptance_stats import AcceptanceStats
from ..errors import first_line
from .atomic import atomic_write, locked, move_aside


def acceptance_path(matrix_path: Path) -> Path:
    return Path(matrix_path).with_suffix(".accept.json")


def read_acceptance(path: Path, k: int, device: torch.device | str) -> AcceptanceStats:
    """The statistics in `path`; ValueError (with the reason) for a file that holds none usable,
    OSError when it cannot be read."""
    stats = AcceptanceStats(k, device)
    try:
        stats.load_dict(json.loads(Path(path).read_text()))
    except (TypeError, AttributeError) as exc:  # JSON of another shape
        raise ValueError(first_line(exc)) from None
    return stats


def load_acceptance(matrix_path: Path, k: int, device: torch.device | str) -> tuple[AcceptanceStats, str | None]:
    """The statistics saved beside the matrix, or the prior alone when there are none; with a
    one-line problem when the file is there but unusable (the prior is used then, and the next
    save moves the file aside)."""
    path = acceptance_path(matrix_path)
    if not path.exists():
        return AcceptanceStats(k, device), None
    try:
        return read_acceptance(path, k, device), None
    except (OSError, ValueError) as exc:
        return AcceptanceStats(k, device), f"{path}: unusable acceptance statistics ({first_line(exc)})"


def save_acceptance(
    matrix_path: Path,
    stats: AcceptanceStats,
    since: AcceptanceStats | None = None,
    waiting: Callable[[str], None] | None = None,
) -> Path:
    """Write `stats`, or, when the file already holds statistics, those plus what `stats` counted
    since `since` (the table as loaded or last saved). An unusable file is moved aside."""
    path = acceptance_path(matrix_path)
    with locked(path, waiting=waiting):
        result = stats
        if path.exists():
            try:
                current = read_acceptance(path, stats.k, stats.hits.device)
            except (OSError, ValueError):
                move_aside(path)
            else:
                result = current.plus_counted(stats, since if since is not None else AcceptanceStats(stats.k))
        atomic_write(path, (json.dumps(result.to_dict()) + "\n").encode())
    return path
