"""What every tr safetensors file (a matrix file, a recycled store) shares: its metadata, a
dataclass kept as strings, and the reading it gets before its own format is checked (there, not
empty, exactly the expected tensors, metadata that parses)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import TypeVar, get_type_hints

import torch

from ..errors import StoreError, first_line

Meta = TypeVar("Meta")
# Metadata a file may lack: files written before it was recorded.
_OPTIONAL = {"tr_version": "?"}


class StringMetadata:
    """A metadata dataclass kept as safetensors' string metadata: every field but tr_version
    required, int fields parsed back as ints."""

    def to_strings(self) -> dict[str, str]:
        return {key: str(value) for key, value in asdict(self).items()}

    @classmethod
    def from_strings(cls: type[Meta], values: dict[str, str]) -> Meta:
        """ValueError naming the fields missing, or for a number that is not one."""
        names = [field.name for field in fields(cls)]
        missing = [name for name in names if name not in values and name not in _OPTIONAL]
        if missing:
            raise ValueError(f"metadata lacks {', '.join(missing)}")
        types = get_type_hints(cls)
        given = {name: values.get(name, _OPTIONAL.get(name)) for name in names}
        return cls(**{name: int(value) if types[name] is int else value for name, value in given.items()})


def read_safetensors(
    path: Path,
    names: tuple[str, ...],
    parse_meta: Callable[[dict[str, str]], Meta],
    kind: str,
    error: type[StoreError],
) -> tuple[Meta, dict[str, torch.Tensor]]:
    """The metadata (parsed by `parse_meta`, which raises ValueError for metadata it cannot use)
    and the tensors `names` of the tr `kind` file at `path`. Anything else is `error`, one line
    naming the file."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such {kind} file")
    if not path.is_file():  # there, so not "no such file"; safetensors maps a file, never a FIFO or device
        raise error(f"{path}: {'a folder' if path.is_dir() else 'a device or FIFO'}, not a tr {kind} file")
    if path.stat().st_size == 0:
        raise error(f"{path}: empty file, not a tr {kind}")
    try:
        with safe_open(str(path), framework="pt") as f:
            found = set(f.keys())
            if found != set(names):
                raise ValueError(
                    f"expected tensors {', '.join(sorted(names))}, found {', '.join(sorted(found)) or 'none'}"
                )
            meta = parse_meta(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in names}
    except (SafetensorError, ValueError, OSError, RuntimeError) as exc:
        raise error(f"{path}: not a valid tr {kind} file ({first_line(exc)})") from None
    return meta, tensors
