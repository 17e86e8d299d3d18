"""A GGUF file's tensors where they lie (the file mapped, read one tensor at a time): each matmul
weight as a WeightSource (weights.py) whose buffers come from its ggml blocks (gguf_blocks.py),
and the other tensors as float values.

Rows are read in chunks of a few million weights and the file's pages are dropped from memory once
read, so a load holds the model's quantized buffers and one chunk beside them, not the file. The
GGUF-to-transformers row order that some architectures need (llama's q/k rows, permuted by the
converter) comes from transformers' own tensor processor, applied to the row numbers.
"""

from __future__ import annotations

import contextlib
import mmap
from pathlib import Path

import numpy as np
import torch

from . import gguf_blocks
from .gguf_header import GGUFHeader, TensorInfo
from .weights import Q4Linear, WeightSource, _columns_padded, _NativeLinear

_CHUNK_WEIGHTS = 1 << 20  # weights converted at a time


class GGUFFile:
    """The file mapped copy-on-write (writable views torch takes without a copy; nothing is ever
    written): `raw` slices, `release` drops pages already read."""

    def __init__(self, path: Path, header: GGUFHeader) -> None:
        self.path, self.header = path, header
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)

    def raw(self, tensor: TensorInfo) -> torch.Tensor:
        start = self.header.data_start + tensor.offset
        return self._bytes[start : start + tensor.nbytes]

    def release(self, tensor: TensorInfo) -> None:
        """Drop the tensor's pages from this process's memory (the OS's page cache keeps them)."""
        page = mmap.PAGESIZE
        start = (self.header.data_start + tensor.offset) // page * page
        end = self.header.data_start + tensor.offset + tensor.nbytes
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        self._bytes = None
        with contextlib.suppress(BufferError):  # a view still held: the map closes with it
            self._map.close()


class GGUFWeight(WeightSource):
    """One matrix of the file, (rows, columns) in transformers' order (`rows`: a row permutation)."""

    def __init__(self, file: GGUFFile, tensor: TensorInfo, rows: torch.Tensor | None = None) -> None:
        self.file, self.tensor = file, tensor
        self.columns, self.rows = tensor.dims[0], int(np.prod(tensor.dims[1:]))
        self.order = rows
        self.stored = gguf_blocks.stored_kind(tensor.ggml_type)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.columns

    def _chunks(self):
        """(first row, raw bytes of the rows from there) in chunks of whole 8-row blocks."""
        raw = self.file.raw(self.tensor).reshape(self.rows, -1)
        step = max(8, _CHUNK_WEIGHTS // max(self.columns, 1) // 8 * 8)
        for start in range(0, self.rows, step):
            stop = min(self.rows, start + step)
            yield start, raw[start:stop] if self.order is None else raw[self.order[start:stop]]

    def buffers(self, kind: type[_NativeLinear]) -> dict[str, torch.Tensor]:
        ggml_type, nibbles = self.tensor.ggml_type, issubclass(kind, Q4Linear)  # int4 and int5: minimums
        if ggml_type not in gguf_blocks.REPACKED[kind.mode] + gguf_blocks.REQUANTIZED[kind.mode]:
            return self._requantized(kind)
        blocks, groups = -(-self.rows // 8), self.columns // gguf_blocks.GROUP
        empty = torch.zeros if self.rows % 8 else torch.empty  # padding rows: zero weights
        levels = empty(blocks, groups, 8 * kind.level_bytes, dtype=torch.uint8 if nibbles else torch.int8)
        steps = empty(blocks, groups, 8, dtype=torch.float16)
        minimums = empty(blocks, groups, 8, dtype=torch.float16) if nibbles else None
        try:
            for start, raw in self._chunks():
                block = slice(start // 8, None)
                torch.ops.tr_kernels.gguf_repack(
                    raw.contiguous(),
                    ggml_type,
                    self.columns,
                    levels[block],
                    steps[block],
                    None if minimums is None else minimums[block],
                )
        finally:
            self.file.release(self.tensor)
        buffers = {"levels": levels, "steps": steps}
        if minimums is not None:
            buffers["minimums"] = minimums
        return buffers

    def _requantized(self, kind: type[_NativeLinear]) -> dict[str, torch.Tensor]:
        """A type neither stored nor requantized by gguf_repack.cpp for the kernels' kind: dequantized
        by gguf, quantized as a float weight (the reference the native requantizing is tested against)."""
        out: dict[str, torch.Tensor] = {}
        blocks = -(-self.rows // 8)
        try:
            for start, raw in self._chunks():
                values = gguf_blocks.dequantized(self.tensor.ggml_type, raw, raw.shape[0], self.columns)
                for name, tensor in kind._quantize(_columns_padded(values)).items():
                    if name not in out:
                        out[name] = torch.empty((blocks, *tensor.shape[1:]), dtype=tensor.dtype)
                    out[name][start // 8 : start // 8 + tensor.shape[0]] = tensor
        finally:
            self.file.release(self.tensor)
        return out

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(self.rows, self.columns, dtype=dtype)
        try:
            for start, raw in self._chunks():
                values = gguf_blocks.dequantized(self.tensor.ggml_type, raw, raw.shape[0], self.columns)
                out[start : start + raw.shape[0]] = values
        finally:
            self.file.release(self.tensor)
        return out


def vector(file: GGUFFile, tensor: TensorInfo, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of any shape as float values in transformers' order (ggml's dims reversed), copied."""
    raw = file.raw(tensor)
    columns = tensor.dims[0]
    rows = tensor.n_elements // columns
    try:
        values = gguf_blocks.dequantized(tensor.ggml_type, raw.reshape(rows, -1), rows, columns)
        return values.reshape(tuple(reversed(tensor.dims))).to(dtype, copy=True)
    finally:
        file.release(tensor)
