"""Just enough of the GGUF header to validate a file before a long load, and its content hash.

The whole header is read (metadata and tensor table, not the tensor data), so a file whose header
cannot be parsed, whose tensor data is cut short or whose metadata is hostile is refused here,
before transformers spends minutes on it or recurses through it."""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
# GGUF value types: fixed-size scalars by type id (struct format), 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# llama.cpp writes flat arrays only; the readers that run after this one (gguf's GGUFReader)
# recurse once per level, so deep nesting is refused here instead of ending in a RecursionError.
MAX_ARRAY_DEPTH = 8
_MAX_DIMS = 4  # GGML_MAX_DIMS
ALIGNMENT = 32  # llama.cpp's default when general.alignment is absent


class GGUFError(ValueError):
    """The file is not a GGUF this reader understands (bad magic, truncated header, ...)."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: where the tensor lies in the data section, and its size."""

    name: str
    dims: tuple[int, ...]  # ggml order: the fastest-moving dimension first
    ggml_type: int
    offset: int  # from the start of the data section
    nbytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's header: metadata values (arrays as their lengths) and the tensor table."""

    version: int
    values: dict[str, object]  # scalar and string metadata
    array_lengths: dict[str, int]  # array metadata: only how many items
    tensors: tuple[TensorInfo, ...]
    data_start: int  # where the tensor data begins (aligned, after the tensor table)
    file_size: int
    # Each metadata entry's key and byte span in the file (key, first byte, end), in file order.
    spans: tuple[tuple[str, int, int], ...] = ()

    @property
    def architecture(self) -> str:
        return str(self.values["general.architecture"])

    @property
    def data_end(self) -> int:
        """The byte just past the last tensor's data: a whole file is at least this long (a file
        without tensors needs no padding after its header, which the parse has read whole)."""
        return max((self.data_start + t.offset + t.nbytes for t in self.tensors), default=0)

    @property
    def n_parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def has(self, key: str) -> bool:
        return key in self.values or key in self.array_lengths

    @property
    def matmul_type(self) -> str | None:
        """The ggml type ('Q4_1', 'Q8_0', 'F16', ...) holding most of the matmul weights (matrices
        other than the token embedding, which is a lookup); None in a file without matrices."""
        counts: dict[int, int] = {}
        for tensor in self.tensors:
            if len(tensor.dims) >= 2 and not tensor.name.startswith("token_embd"):
                counts[tensor.ggml_type] = counts.get(tensor.ggml_type, 0) + tensor.n_elements
        if not counts:
            return None
        return ggml_type_name(max(counts, key=counts.__getitem__))


class _Cursor:
    """Reads little-endian values from the mapped file, refusing to run past its end."""

    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError("file ends inside the header (truncated?)")
        self.pos += n

    def take(self, fmt: str):
        start = self.pos
        self.skip(struct.calcsize("<" + fmt))
        return struct.unpack_from("<" + fmt, self.buf, start)[0]

    def string(self) -> str:
        n = self.take("Q")
        if n > 1 << 24:
            raise GGUFError("implausible string length in the header (corrupt file?)")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start : self.pos]).decode("utf-8", errors="replace")


def _skip_array(cur: _Cursor, key: str, depth: int) -> int:
    """Skip an array's items; returns their count."""
    if depth > MAX_ARRAY_DEPTH:
        raise GGUFError(f"metadata value {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep (corrupt file?)")
    item_type, count = cur.take("I"), cur.take("Q")
    if item_type in _SCALARS:
        cur.skip(count * struct.calcsize("<" + _SCALARS[item_type]))
    elif item_type == _STRING:
        _skip_strings(cur, count)
    elif item_type == _ARRAY:
        for _ in range(count):
            _skip_array(cur, key, depth + 1)
    else:
        raise GGUFError(f"unknown value type {item_type} in metadata value {key!r} (corrupt file?)")
    return count


_LENGTH = struct.Struct("<Q")


def _skip_strings(cur: _Cursor, count: int) -> None:
    """Skip `count` length-prefixed strings: a vocabulary's 50-150k of them, so one tight loop (through
    the cursor's methods it took ~0.3 s of every start on SmolLM2's header)."""
    buf, pos, end = cur.buf, cur.pos, len(cur.buf)
    length = _LENGTH.unpack_from
    for _ in range(count):  # each item takes at least 8 bytes, so a bogus count ends at EOF
        if pos + 8 > end:
            raise GGUFError("file ends inside the header (truncated?)")
        pos += 8 + length(buf, pos)[0]
    if pos > end:
        raise GGUFError("file ends inside the header (truncated?)")
    cur.pos = pos


def ggml_type_name(ggml_type: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def _tensor_nbytes(name: str, dims: tuple[int, ...], ggml_type: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES  # a dependency of tr; imported only for GGUF files

    sizes = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
    if ggml_type not in sizes:
        raise GGUFError(f"tensor {name} has unknown ggml type {ggml_type} (corrupt file, or a newer format?)")
    block_size, type_size = sizes[ggml_type]
    return math.prod(dims) * type_size // block_size


def _parse(buf, file_size: int) -> GGUFHeader:
    cur = _Cursor(buf)
    magic = bytes(buf[:4])
    if magic != MAGIC:
        if MAGIC.startswith(magic):
            raise GGUFError("file ends inside the header (truncated?)")
        raise GGUFError("not a GGUF file (bad magic bytes)")
    cur.skip(4)
    version = cur.take("I")
    if version < 2:
        raise GGUFError(f"GGUF version {version} is too old")
    tensor_count, kv_count = cur.take("Q"), cur.take("Q")
    values: dict[str, object] = {}
    array_lengths: dict[str, int] = {}
    spans = []
    for _ in range(kv_count):
        start = cur.pos
        key = cur.string()
        vtype = cur.take("I")
        if vtype in _SCALARS:
            values[key] = cur.take(_SCALARS[vtype])
        elif vtype == _STRING:
            values[key] = cur.string()
        elif vtype == _ARRAY:
            array_lengths[key] = _skip_array(cur, key, 1)
        else:
            raise GGUFError(f"unknown value type {vtype} for metadata key {key!r} (corrupt file?)")
        spans.append((key, start, cur.pos))
    if "general.architecture" not in values:
        raise GGUFError("no general.architecture in the header")
    tensors = []
    for _ in range(tensor_count):
        name = cur.string()
        n_dims = cur.take("I")
        if n_dims > _MAX_DIMS:
            raise GGUFError(f"tensor {name} has {n_dims} dimensions (corrupt file?)")
        dims = tuple(cur.take("Q") for _ in range(n_dims))
        ggml_type, offset = cur.take("I"), cur.take("Q")
        tensors.append(TensorInfo(name, dims, ggml_type, offset, _tensor_nbytes(name, dims, ggml_type)))
    alignment = values.get("general.alignment", ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"general.alignment {alignment!r} is not a power of two (corrupt file?)")
    data_start = -(-cur.pos // alignment) * alignment
    return GGUFHeader(version, values, array_lengths, tuple(tensors), data_start, file_size, tuple(spans))


# Headers parsed in this process, by file version (read_header): a start resolves its model twice
# (its options, then its load), and a big vocabulary's header takes ~60 ms to parse.
_PARSED: dict[tuple[int, ...], GGUFHeader] = {}
_PARSED_KEPT = 8


def read_header(path: Path) -> GGUFHeader:
    """The header (metadata and tensor table) of a GGUF file, without reading its tensor data;
    parsed once per version of the file (device, inode, size, modification and change times) in
    this process, so callers share the result and must not modify it."""
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())
        version = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        header = _PARSED.get(version)
        if header is not None:
            return header
        if stat.st_size == 0:
            raise GGUFError("file is empty (an interrupted download?)")
        # Mapped, not read: only the header's pages are touched, however big the file.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = _parse(buf, stat.st_size)
    _PARSED[version] = header
    while len(_PARSED) > _PARSED_KEPT:
        del _PARSED[next(iter(_PARSED))]  # the oldest
    return header


def file_sha256(path: Path, memo_file: Path | None = None, hashing: Callable[[], None] | None = None) -> str:
    """SHA-256 of the file, remembered per (path, size, mtime) so a big file is hashed once;
    `hashing` is told when it really reads the file (a status line worth showing)."""
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
    if hashing is not None:
        hashing()
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
