"""Quantized weights kept on disk, so that a model's later starts skip quantizing it (0.9 s of a
SmolLM2 start on a 2-core AVX2 EPYC; a minute for a 7B model).

`quantize` (weights.py) computes each layer's buffers with its kind's `_quantize`, in the model's
module order. Inside `remembered(path)` each of those calls first looks at the same call of the
run that wrote `path`: when the kind, the weight's shape and a sample of its values match, the
stored buffers are taken as they are; from the first mismatch on everything is computed afresh and
the file is written again at the end (atomically). The caller keys `path` by what decides the
result (the checkpoint's files, the mode, tr's quantizing code and kernel sources, torch's version
and CPU capability, whose int4 packing differs by instruction set), so a mismatch is a safety net,
not the rule; an older variant of the same checkpoint and mode is removed when a new one is kept.

What is replayed is checked before a kernel sees it, so no file can crash a start: each buffer's
name, shape and dtype against the layout its kind computes for that weight, its bytes against the
CRC-32 stored with them, and it is copied into memory of torch's own alignment. A tensor read
from safetensors lies at its offset in the file, 8-byte aligned only, and torch's int8 kernel
(`_weight_int8pack_mm`, AVX-512, 4 rows or more) reads its weight with 16-byte aligned loads: the
int8 output head of an int4/int8 bfloat16 model replayed at an odd multiple of 8 crashed every
later start (SIGSEGV). Whatever fails a check is computed afresh, and the file written again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path

import torch

_QUANTIZING_CODE = (Path(__file__).with_name("weights.py"),)  # with the kernel sources: see cache_name

# Bump when a kind's buffers change for the same weight (a new packing, rounding, padding) or the
# file's index does (2: each buffer's shape, dtype and CRC-32).
PACKING_VERSION = 2
ALIGNMENT = 64  # bytes: torch's CPU allocator's, which every kernel we call takes
Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]  # a kind's buffers for one weight: name -> shape, dtype
_SAMPLES = 8  # rows and columns of each weight whose values are compared with the stored run's


def _probe(weight: torch.Tensor) -> str:
    """The weight's shape and its values at a spread grid of rows and columns, as text (exact, not
    a hash; indexed without copying the weight, which may be a transposed view)."""
    rows, columns = (torch.linspace(0, n - 1, min(n, _SAMPLES)).long() for n in weight.shape)
    sample = weight.index_select(0, rows).index_select(1, columns).double().flatten().tolist()
    return json.dumps([list(weight.shape), sample])


class _Memory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.stored: list[tuple[str, str, dict[str, torch.Tensor]]] = _read(path)
        self.stale: list[Path] = []  # older variants to remove once this one is kept
        self.calls: list[tuple[str, str, dict[str, torch.Tensor]]] = []
        self.replaying = True

    def buffers(
        self,
        kind: str,
        weight: torch.Tensor,
        compute: Callable[[torch.Tensor], dict[str, torch.Tensor]],
        layout: Layout,
    ) -> dict[str, torch.Tensor]:
        probe = _probe(weight)
        at = len(self.calls)
        stored = self.stored[at] if self.replaying and at < len(self.stored) else None
        if stored is not None and stored[:2] == (kind, probe) and fits_layout(stored[2], layout):
            buffers = stored[2]
        else:
            if self.replaying:
                self.replaying, self.stored = False, []  # nothing more to take: free it now
            buffers = compute(weight)
        self.calls.append((kind, probe, buffers))
        return buffers

    def save_if_changed(self) -> None:
        if self.replaying and len(self.calls) == len(self.stored) > 0:
            return
        from safetensors.torch import save

        tensors, index = {}, []
        for i, (kind, probe, buffers) in enumerate(self.calls):
            entry = {}
            for name, tensor in sorted(buffers.items()):
                tensors[f"{i}.{name}"] = tensor = tensor.contiguous()
                entry[name] = [list(tensor.shape), str(tensor.dtype), _crc(tensor)]
            index.append([kind, probe, entry])
        meta = {"index": json.dumps(index), "packing_version": str(PACKING_VERSION)}
        payload = save(tensors, metadata=meta)
        # Written beside and renamed over: a reader sees the old file or the new one. A cache, so
        # no fsync: a file a crash cut short reads as damaged and is computed again.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())  # a crash leaves the old file or a whole new one, never zeros
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        for old in self.stale:
            with contextlib.suppress(OSError):
                old.unlink()


def fits_layout(buffers: dict[str, torch.Tensor], layout: Layout) -> bool:
    """Whether `buffers` are what a kernel of that `layout` may be given: the same names, shapes and
    dtypes, contiguous, at ALIGNMENT."""
    return buffers.keys() == layout.keys() and all(
        tuple(tensor.shape) == layout[name][0]
        and tensor.dtype == layout[name][1]
        and tensor.is_contiguous()
        and tensor.data_ptr() % ALIGNMENT == 0
        for name, tensor in buffers.items()
    )


def _crc(tensor: torch.Tensor) -> int:
    """CRC-32 of a contiguous tensor's bytes (65 ms for SmolLM2's 139 MB of int4+bf16 buffers)."""
    return zlib.crc32(tensor.reshape(-1).view(torch.uint8).numpy()) if tensor.numel() else 0


def _read(path: Path) -> list[tuple[str, str, dict[str, torch.Tensor]]]:
    """The stored calls up to the first whose buffers do not read back as written (shape, dtype,
    CRC-32), each buffer copied out of the file into memory of torch's alignment; none when the file
    is missing, unreadable or of another packing."""
    from safetensors import SafetensorError, safe_open

    calls: list[tuple[str, str, dict[str, torch.Tensor]]] = []
    try:
        if not path.is_file():
            return []
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("packing_version") != str(PACKING_VERSION):
                return []
            for i, (kind, probe, entry) in enumerate(json.loads(meta["index"])):
                buffers = {}
                for name, (shape, dtype, crc) in entry.items():
                    # A copy: the file's tensor lies at its offset in the file, 8-byte aligned only.
                    tensor = f.get_tensor(f"{i}.{name}").clone(memory_format=torch.contiguous_format)
                    if list(tensor.shape) != shape or str(tensor.dtype) != dtype or _crc(tensor) != crc:
                        return calls
                    buffers[name] = tensor
                calls.append((kind, probe, buffers))
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError):
        return calls  # what read back whole is replayed; the rest is recomputed and the file replaced
    return calls


_ACTIVE: ContextVar[_Memory | None] = ContextVar("quantized_weights", default=None)


def quantized_buffers(
    kind: str, weight: torch.Tensor, compute: Callable[[torch.Tensor], dict[str, torch.Tensor]], layout: Layout
) -> dict[str, torch.Tensor]:
    """`compute(weight)`, or what the remembered run stored for this call where it has `layout`
    (the buffers `compute` gives for a weight of this shape)."""
    memory = _ACTIVE.get()
    return compute(weight) if memory is None else memory.buffers(kind, weight, compute, layout)


@contextlib.contextmanager
def remembered(path: Path, stale: list[Path] = ()) -> Iterator[_Memory]:
    """Quantize inside this block reusing, and then keeping, what `path` holds (removing the
    `stale` files once it is kept). A cache that cannot be read or written is not an error: the
    next start computes again."""
    memory = _Memory(path)
    memory.stale = list(stale)
    token = _ACTIVE.set(memory)
    try:
        yield memory
    finally:
        _ACTIVE.reset(token)
    with contextlib.suppress(Exception):  # noqa: BLE001 - a cache: full disk, no permission, no memory
        memory.save_if_changed()


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def cache_name(location: Path, mode: str, dtype: str, code: tuple[Path, ...] = ()) -> tuple[str, str]:
    """(prefix, file name) of a checkpoint's quantized weights: the prefix names the checkpoint
    directory, mode and dtype; the rest its weight files (name, size, modification time), the
    quantizing code and `code` (the kernel sources) by content, torch's and transformers' versions
    and torch's CPU capability. Files with the prefix and another name are older variants."""
    from importlib.metadata import version

    files = sorted(p for p in location.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".json"))
    stats = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    sources = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (*_QUANTIZING_CODE, *code)]
    prefix = _digest([str(location.resolve()), mode, dtype])
    variant = _digest(
        [
            stats,
            sources,
            torch.__version__,
            version("transformers"),
            torch.backends.cpu.get_cpu_capability(),
            PACKING_VERSION,
        ]
    )
    return prefix, f"{prefix}-{variant}.safetensors"
