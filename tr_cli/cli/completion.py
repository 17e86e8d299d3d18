"""Shell-completion candidates for argument values: models and stored matrices.

Used as Typer `autocompletion=` callbacks (each returns (value, help) pairs for the word being
completed). Nothing here reads more than directory listings and a few small files: a shell waits
for the answer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

Candidate = tuple[str, str]


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory, resolved as huggingface_hub.constants does."""
    hf_home = os.path.expandvars(
        os.path.expanduser(
            os.environ.get(
                "HF_HOME",
                os.path.join(
                    os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "huggingface"
                ),
            )
        )
    )
    legacy = os.environ.get("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home, "hub"))
    return Path(os.path.expandvars(os.path.expanduser(os.environ.get("HF_HUB_CACHE", legacy))))


def cached_hub_models(cache: Path | None = None) -> list[str]:
    """Model ids whose `main` snapshot in the local hub cache has a config.json.

    That is exactly what `tr` accepts as a cached Hugging Face id (it never downloads).
    """
    cache = hf_hub_cache() if cache is None else cache
    found = []
    try:
        folders = sorted(entry.name for entry in os.scandir(cache) if entry.name.startswith("models--"))
    except OSError:
        return []
    for folder in folders:
        repo = cache / folder
        try:
            revision = (repo / "refs" / "main").read_text().strip()
        except OSError:
            continue
        if revision and (repo / "snapshots" / revision / "config.json").is_file():
            found.append(folder.removeprefix("models--").replace("--", "/"))
    return found


def _is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def path_candidates(incomplete: str, suffixes: Iterable[str]) -> list[Candidate]:
    """Files with one of `suffixes` and directories whose path starts with `incomplete`.

    The user's spelling of the directory part is kept (`~/models/`, `./`); hidden entries only
    when the typed name starts with a dot. Checkpoint directories (with a config.json) complete
    as they are; other directories end with `/`, to go on typing inside them.
    """
    head, tail = os.path.split(incomplete)
    directory = os.path.expanduser(head) if head else os.curdir
    suffixes = tuple(suffixes)
    out: list[Candidate] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return []
    for entry in entries:
        name = entry.name
        if not name.startswith(tail) or (name.startswith(".") and not tail.startswith(".")):
            continue
        value = os.path.join(head, name) if head else name
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if is_dir:
            if _is_checkpoint(entry.path):
                out.append((value, "checkpoint directory"))
            else:
                out.append((value + "/", "directory"))
        elif name.endswith(suffixes):
            out.append((value, "GGUF file" if name.endswith(".gguf") else "file"))
    return out


def complete_model(incomplete: str, packaged: Iterable[str] = ("smollm2",)) -> list[Candidate]:
    """A model argument: packaged names, GGUF files and directories, cached Hugging Face ids."""
    out = [(name, "packaged model") for name in packaged if name.startswith(incomplete)]
    out += path_candidates(incomplete, (".gguf",))
    taken = {value for value, _ in out}
    out += [
        (model_id, "cached Hugging Face model")
        for model_id in cached_hub_models()
        if model_id.startswith(incomplete) and model_id not in taken
    ]
    return out


def stored_matrices(root: Path | None = None) -> list[str]:
    """Paths of the matrix files in the data dir (what `tr matrix inspect FILE` accepts), sorted."""
    try:
        from ..store.matrix_file import matrix_file_paths  # torch: only when completing a matrix

        return [str(path) for path in matrix_file_paths(root)]
    except OSError:  # a data dir that cannot be listed: nothing to offer
        return []


def complete_matrix(incomplete: str) -> list[Candidate]:
    """A matrix argument (`tr matrix inspect ...`): stored matrix files, then models."""
    out = [(path, "stored matrix") for path in stored_matrices() if path.startswith(incomplete)]
    return out + complete_model(incomplete)
