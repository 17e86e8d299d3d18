"""Writes that a crash or a concurrent writer cannot leave half done, and the lock that
serializes read-merge-write cycles on one file."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .timestamps import now_us


def atomic_write(path: Path, payload: bytes) -> None:
    """Temp file in the same directory, fsync, rename over the target, fsync the directory:
    readers see the old file or the new one, never a partial write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive lock for read-merge-write on one matrix (a sibling .lock file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def move_aside(path: Path) -> Path:
    """Rename an unreadable file to `<name>.corrupt-<us>`: a save never silently overwrites what
    the user may still want to look at."""
    target = path.with_name(path.name + f".corrupt-{now_us()}")
    os.replace(path, target)
    return target
