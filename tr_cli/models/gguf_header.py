"""Just enough of the GGUF header to validate a file before a long load, and its content hash."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

MAGIC = b"GGUF"
# GGUF value types: fixed-size scalars by type id (struct format), 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF this reader understands (bad magic, truncated header, ...)."""


def _read(f, fmt: str):
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("file ends inside the header (truncated?)")
    return struct.unpack("<" + fmt, data)[0]


def _read_string(f) -> str:
    n = _read(f, "Q")
    if n > 1 << 24:
        raise GGUFError("implausible string length in the header (corrupt file?)")
    return f.read(n).decode("utf-8", errors="replace")


def _skip_value(f, vtype: int) -> None:
    if vtype in _SCALARS:
        f.seek(struct.calcsize("<" + _SCALARS[vtype]), os.SEEK_CUR)
    elif vtype == _STRING:
        f.seek(_read(f, "Q"), os.SEEK_CUR)
    elif vtype == _ARRAY:
        item_type, count = _read(f, "I"), _read(f, "Q")
        if item_type in _SCALARS:
            f.seek(count * struct.calcsize("<" + _SCALARS[item_type]), os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(f, item_type)
    else:
        raise GGUFError(f"unknown value type {vtype} in the header (corrupt file?)")


def read_architecture(path: Path) -> str:
    """The `general.architecture` value, reading only the header's key/value section."""
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise GGUFError("not a GGUF file (bad magic bytes)")
        version = _read(f, "I")
        if version < 2:
            raise GGUFError(f"GGUF version {version} is too old")
        _read(f, "Q")  # tensor count
        kv_count = _read(f, "Q")
        for _ in range(kv_count):
            key = _read_string(f)
            vtype = _read(f, "I")
            if key == "general.architecture" and vtype == _STRING:
                return _read_string(f)
            _skip_value(f, vtype)
    raise GGUFError("no general.architecture in the header")


def file_sha256(path: Path, memo_file: Path | None = None) -> str:
    """SHA-256 of the file, remembered per (path, size, mtime) so a big file is hashed once."""
    stat = path.stat()
    memo_key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    memo: dict[str, str] = {}
    if memo_file and memo_file.exists():
        try:
            memo = json.loads(memo_file.read_text())
        except (OSError, ValueError):
            memo = {}
    if memo_key in memo:
        return memo[memo_key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    value = digest.hexdigest()
    if memo_file:
        memo[memo_key] = value
        try:
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, memo_file)
        except OSError:
            pass  # only a speed-up
    return value
