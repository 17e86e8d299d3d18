"""Writes that a crash or a concurrent writer cannot leave half done, and the lock that
serializes read-merge-write cycles on one file."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import StoreError
from .timestamps import now_us

# A temp file this old is a write that never finished (the process was killed): no write takes
# anywhere near this long, so removing it cannot race with a live writer.
STALE_TEMP_SECONDS = 600
LOCK_WAIT_SECONDS = 30.0
LOCK_NOTICE_SECONDS = 1.0  # a wait shorter than this is another save finishing: not worth a line


def temp_files(path: Path) -> list[Path]:
    """The temp files writes of `path` leave while they run."""
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))


def remove_stale_temp_files(path: Path, older_than: float = STALE_TEMP_SECONDS) -> int:
    """Delete what killed writes of `path` left behind; how many were removed."""
    removed = 0
    now = time.time()
    for tmp in temp_files(path):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime > older_than:
                tmp.unlink()
                removed += 1
    return removed


def atomic_write(path: Path, payload: bytes) -> None:
    """Temp file in the same directory, fsync, rename over the target, fsync the directory:
    readers see the old file or the new one, never a partial write. Temp files of writes that a
    SIGKILL cut short are cleaned here, so they never accumulate."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path)
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
def locked(
    path: Path, timeout: float = LOCK_WAIT_SECONDS, waiting: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Exclusive lock for read-merge-write on one matrix (a sibling .lock file). Another process
    holding it longer than `timeout` seconds (a hung tr) is a StoreError naming the lock file,
    never an endless wait; `waiting` hears once, after a second, that the wait has begun."""
    path = Path(path)
    lock_path = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "a")  # noqa: SIM115 - closed by the with below
    except OSError as exc:  # a read-only home, a full disk, a folder of someone else's
        raise StoreError(
            f"{path}: cannot make its lock file {lock_path} ({exc.strerror or exc}); not written "
            f"(is {path.parent} read-only or full?)"
        ) from None
    with lock:
        start = time.monotonic()
        told = waiting is None
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if not told and waited >= LOCK_NOTICE_SECONDS:
                    waiting(f"{lock_path} is held by another process; waiting up to {timeout:g} s to save")
                    told = True
                if waited >= timeout:
                    raise StoreError(
                        f"{path}: another process has held {lock_path} for over {timeout:g} s (a hung tr?); not written"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def kept_aside(path: Path) -> set[Path]:
    """What move_aside kept of `path` and of the files beside it (`<stem>.*.corrupt-<us>`)."""
    stem = path.name.split(".", 1)[0]
    return set(path.parent.glob(f"{glob.escape(stem)}.*.corrupt-*"))


def move_aside(path: Path) -> Path:
    """Rename an unreadable file to `<name>.corrupt-<us>`: a save never silently overwrites what
    the user may still want to look at."""
    target = path.with_name(path.name + f".corrupt-{now_us()}")
    os.replace(path, target)
    return target
