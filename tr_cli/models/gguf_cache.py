"""A GGUF's config, generation config and tokenizer as transformers files, converted once and cached
by the file's SHA-256 (a few MB: the weights are read from the GGUF itself at every start,
gguf_load.py). transformers' GGUF readers take seconds on a big vocabulary; its files load in
a fraction of one.

Every file is listed with its SHA-256 in a manifest written last; a start checks them all before
use, and a cache that is incomplete, truncated or altered is converted again, never trusted."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import ModelError, first_line
from .gguf_header import GGUFHeader, file_sha256, read_header
from .gguf_metadata import fast_side_files
from .gguf_rope import set_rope_scaling
from .progress import Status

# Config, generation config and tokenizer files: a few MB for any vocabulary.
_SIDE_FILES_BYTES = 32_000_000
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
_NO_ROOM = "free some space there, or point TR_HOME at a disk with more room"
MANIFEST = "MANIFEST.json"
# What transformers raises on a GGUF it reads and rejects.
_CONVERSION_ERRORS = (ValueError, KeyError, IndexError, TypeError, RuntimeError, NotImplementedError, OSError)
# Bump when what is converted changes (files, their content for the same GGUF).
_LAYOUT = 3  # 3: rotary scaling outside transformers' config map (LongRoPE, linear, YaRN)


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _check_room(path: Path, root: Path) -> None:
    free = shutil.disk_usage(root).free
    if free < _SIDE_FILES_BYTES:
        raise ModelError(
            f"model {path.name}: not enough disk space to cache its converted tokenizer and config in {root}: "
            f"needs about {_megabytes(_SIDE_FILES_BYTES)}, {_megabytes(free)} free; {_NO_ROOM}"
        )


_ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def _save_tokenizer(tokenizer, directory: Path) -> None:
    """The tokenizer's files, its added tokens listed in tokenizer_config.json as well. transformers
    leaves them out there for a tokenizers-backed tokenizer, and loading one without them parses
    the whole tokenizer.json in Python to find them (0.15 s of each SmolLM2 start)."""
    tokenizer.save_pretrained(directory)
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if "added_tokens_decoder" not in config:
        config["added_tokens_decoder"] = {
            str(index): {field: getattr(token, field) for field in _ADDED_TOKEN_FIELDS}
            for index, token in sorted(tokenizer.added_tokens_decoder.items())
        }
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_manifest(directory: Path, source: Path, digest: str) -> None:
    files = sorted(p.name for p in directory.iterdir() if p.is_file())
    manifest = {
        "layout": _LAYOUT,
        "source": str(source.resolve()),
        "sha256": digest,
        "files": {name: _sha256(directory / name) for name in files},
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def valid(directory: Path) -> bool:
    """Whether a cached conversion is whole: its manifest readable and of this layout, every file
    it lists there with the content it lists, config.json among them."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("layout") != _LAYOUT or "config.json" not in files:
            return False
        return all(_sha256(directory / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _read_side_files(path: Path, header: GGUFHeader, root: Path):
    """(config, tokenizer) from the GGUF: each file read once where transformers has a fast
    tokenizer reader (gguf_metadata.py), else, or where that route fails, transformers' own."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        sides = fast_side_files(path, header, root)
    except _CONVERSION_ERRORS:
        sides = None  # transformers' own route below says what is wrong with the file
    if sides is not None:
        return sides
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name), tokenizer


def gguf_side_files(path: Path, root: Path, status: Status) -> Path:
    """A directory of transformers files (config, generation config, tokenizer) converted from the
    GGUF, cached under `root` by the file's hash and validated before use (rebuilt when damaged)."""
    from transformers import GenerationConfig

    digest = file_sha256(path, root / "hashes.json", hashing=lambda: status(f"Hashing {path.name}"))
    target = root / digest[:32]
    if valid(target):
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"model {path.name}: cannot create the cache directory {root} ({exc.strerror})") from None
    _check_room(path, root)
    status(f"Reading {path.name}'s tokenizer and config (first load only, cached afterwards)")
    header = read_header(path)
    try:
        config, tokenizer = _read_side_files(path, header, root)
    except _CONVERSION_ERRORS as exc:
        # resolve_model checked the header; what is left is a file transformers reads and rejects
        raise ModelError(
            f"model {path.name}: transformers cannot convert this GGUF ({first_line(exc)}); "
            "pass another .gguf or the model's transformers checkpoint"
        ) from None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    set_rope_scaling(config, path, header)  # what transformers' readers leave out of the config
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=root))
        try:
            config.save_pretrained(tmp)
            GenerationConfig.from_model_config(config).save_pretrained(tmp)
            _save_tokenizer(tokenizer, tmp)
            _write_manifest(tmp, path, digest)
            if target.exists():  # a damaged earlier conversion: replaced whole
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.rename(tmp, target)  # atomic: a reader sees no conversion or a whole one
            except OSError:
                if not valid(target):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # the partial conversion, whatever stopped it
    except OSError as exc:
        if exc.errno in _FULL_DISK:
            raise ModelError(
                f"model {path.name}: the disk filled up while caching its converted tokenizer and config in "
                f"{root} (needs about {_megabytes(_SIDE_FILES_BYTES)}); {_NO_ROOM}"
            ) from None
        raise ModelError(
            f"model {path.name}: cannot write its converted tokenizer and config to {root} "
            f"({exc.strerror or exc}); make the directory writable, or point TR_HOME elsewhere"
        ) from None
    return target
