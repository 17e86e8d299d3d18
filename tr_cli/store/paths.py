"""Where tr keeps its files. TR_HOME moves everything (tests point it at a temp dir)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import platformdirs

from ..errors import StoreError

APP = "tr"


def _home() -> Path | None:
    value = os.environ.get("TR_HOME")
    if not value:
        return None
    home = Path(value).expanduser()
    if home.exists() and not home.is_dir():
        raise StoreError(f"TR_HOME={value} is not a directory; point TR_HOME at a directory (it is created if missing)")
    return home


def data_dir() -> Path:
    """tr's home folder of durable state: matrix files and their recycled stores, history, calibration."""
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP))


def matrices_dir() -> Path:
    """Where the data dir keeps the matrix files (one per tokenizer) and the files beside them."""
    return data_dir() / "matrices"


def cache_dir() -> Path:
    """Rebuildable state: converted GGUF checkpoints."""
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP))


def seed_dir() -> Path:
    """Starter state shipped with tr (tr_cli/seed/): read-only, for tokenizers with no matrix yet."""
    return Path(str(resources.files("tr_cli.seed")))
