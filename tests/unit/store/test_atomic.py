"""atomic_write and locked: a killed write leaves nothing that accumulates, a hung holder of the
lock costs a bounded wait and a StoreError naming the lock file (issue 15)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from tr_cli.errors import StoreError
from tr_cli.store.atomic import STALE_TEMP_SECONDS, atomic_write, locked, temp_files


def test_a_write_cleans_temp_files_that_killed_writes_left(tmp_path):
    target = tmp_path / "m.safetensors"
    atomic_write(target, b"old")
    # What SIGKILL during a write leaves: its temp file, never renamed.
    stale = [tmp_path / f".m.safetensors.{name}.tmp" for name in ("a1b2", "c3d4")]
    for path in stale:
        path.write_bytes(b"partial")
        old = time.time() - STALE_TEMP_SECONDS - 5
        os.utime(path, (old, old))
    fresh = tmp_path / ".m.safetensors.live.tmp"  # a write in progress right now: left alone
    fresh.write_bytes(b"partial")
    other = tmp_path / ".other.safetensors.zz.tmp"  # another file's temp: not ours to touch
    other.write_bytes(b"partial")
    os.utime(other, (0, 0))
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert temp_files(target) == [fresh]
    assert other.exists()


def test_a_hung_lock_holder_is_a_bounded_wait_and_a_store_error(tmp_path):
    target = tmp_path / "m.safetensors"
    target.parent.mkdir(exist_ok=True)
    with open(tmp_path / "m.safetensors.lock", "a") as held:  # another process's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        start = time.monotonic()
        with pytest.raises(StoreError, match=r"m\.safetensors\.lock"), locked(target, timeout=0.3):
            pass
        assert time.monotonic() - start < 5
    with locked(target, timeout=0.3):  # released: taken at once
        pass


def test_a_wait_for_the_lock_is_announced_once(tmp_path):
    target = tmp_path / "m.safetensors"
    heard: list[str] = []
    with open(tmp_path / "m.safetensors.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(StoreError), locked(target, timeout=1.6, waiting=heard.append):
            pass
    assert heard == [f"{tmp_path / 'm.safetensors.lock'} is held by another process; waiting up to 1.6 s to save"]
    with locked(target, timeout=5, waiting=heard.append):  # free: no wait, nothing said
        pass
    assert len(heard) == 1


def test_a_lock_file_that_cannot_be_made_is_a_store_error_naming_it():
    """A read-only home (`tr matrix import` on one was `unexpected OSError`). /proc takes no new
    file, also from root."""
    expected = r"^/proc/m.safetensors: cannot make its lock file /proc/m.safetensors.lock \("
    with pytest.raises(StoreError, match=expected):
        with locked(Path("/proc/m.safetensors")):
            pytest.fail("the lock was taken")
