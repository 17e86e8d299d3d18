"""The acceptance statistics learned with a matrix, kept beside it (`<matrix>.accept.json`), so a
hot start also starts with a tree fitted to how well that matrix drafts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..core.design.acceptance_stats import AcceptanceStats
from .atomic import atomic_write, move_aside


def acceptance_path(matrix_path: Path) -> Path:
    return Path(matrix_path).with_suffix(".accept.json")


def load_acceptance(matrix_path: Path, k: int, device: torch.device | str) -> AcceptanceStats:
    """The statistics saved beside the matrix; the prior alone when there are none (or they are
    unreadable: they are rebuilt while decoding, and a bad file is moved aside on the next save)."""
    stats = AcceptanceStats(k, device)
    path = acceptance_path(matrix_path)
    if path.exists():
        try:
            stats.load_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    return stats


def save_acceptance(matrix_path: Path, stats: AcceptanceStats) -> Path:
    path = acceptance_path(matrix_path)
    if path.exists():
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            move_aside(path)
    atomic_write(path, (json.dumps(stats.to_dict()) + "\n").encode())
    return path
