"""Recycled store files: the path rule, round trips, merged saves under the lock, eviction by
capacity, refusal of every kind of bad file (one line, file untouched), corrupt files moved
aside, and another tokenizer's store refused."""

import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tr_cli.core.recycled_store import RecycledStore
from tr_cli.errors import StoreError, StoreFileError
from tr_cli.store import recycled_file
from tr_cli.store.recycled_file import (
    FORMAT_VERSION,
    RecycledStoreFile,
    RecycledStoreMeta,
    check_recycled_store_compatible,
    read_recycled_store,
    recycled_store_path,
    save_recycled_store,
    write_recycled_store,
)

VOCAB = 64
FP = "abc"


def tokens(start: int, n: int = 8) -> list[int]:
    return [(start + i) % VOCAB for i in range(n)]


def store_with(*docs: tuple[int, int], capacity: int = 1000) -> RecycledStore:
    """A store whose `added` holds one 8-token document per (first token, stamp)."""
    store = RecycledStore(VOCAB, capacity=capacity)
    for first, stamp in docs:
        assert store.add(tokens(first), stamp)
    return store


def contents(data: RecycledStoreFile) -> list[tuple[int, list[int]]]:
    return [(doc.stamp, doc.tokens.tolist()) for doc in data.documents]


def test_store_lives_beside_its_matrix(tmp_path):
    assert recycled_store_path(Path("m/abc-v49152-k8.safetensors")) == Path("m/abc-v49152-k8.store.safetensors")
    assert recycled_store_path(tmp_path / "out.safetensors") == tmp_path / "out.store.safetensors"


def test_round_trip(tmp_path):
    path = tmp_path / "s.store.safetensors"
    store = store_with((1, 100), (30, 200))
    store.add(list(range(20)), 300)
    meta = RecycledStoreMeta(VOCAB, FP, "model-x", capacity=1000)
    write_recycled_store(path, RecycledStoreFile(meta, store.documents))
    back = read_recycled_store(path)
    assert back.meta == meta
    assert contents(back) == [(100, tokens(1)), (200, tokens(30)), (300, list(range(20)))]
    assert all(doc.tokens.dtype == torch.int32 for doc in back.documents)
    assert back.total_tokens == 36
    assert back.to_store().total_tokens == 36 and back.to_store().capacity == 1000
    # An empty store is a valid file too.
    write_recycled_store(path, RecycledStoreFile(meta, []))
    assert read_recycled_store(path).documents == []


def test_save_merges_with_what_the_file_holds_and_clears_added(tmp_path):
    path = tmp_path / "s.store.safetensors"
    first = store_with((1, 300))
    second = store_with((2, 100), (3, 500))  # another process, started earlier, saving later
    assert save_recycled_store(path, first, FP, "m") is not None
    assert first.added == []
    save_recycled_store(path, second, FP, "m")
    assert [stamp for stamp, _ in contents(read_recycled_store(path))] == [100, 300, 500]  # ordered by stamp
    assert save_recycled_store(path, second, FP, "m") is None  # nothing new: not written


def test_a_document_already_in_the_file_is_not_stored_twice(tmp_path):
    path = tmp_path / "s.store.safetensors"
    store = store_with((1, 100))
    twin = list(store.added)
    save_recycled_store(path, store, FP, "m")
    store.added.extend(twin)  # the same conversation offered again (same stamp and length)
    save_recycled_store(path, store, FP, "m")
    assert contents(read_recycled_store(path)) == [(100, tokens(1))]


def test_oldest_documents_are_evicted_past_capacity(tmp_path):
    path = tmp_path / "s.store.safetensors"
    save_recycled_store(path, store_with((1, 100), (2, 200), capacity=24), FP, "m")
    save_recycled_store(path, store_with((3, 300), (4, 50), capacity=24), FP, "m")
    # 4 documents of 8 tokens, capacity 24: the oldest stamp (50, saved last) goes first.
    assert [stamp for stamp, _ in contents(read_recycled_store(path))] == [100, 200, 300]
    assert read_recycled_store(path).meta.capacity == 24


def test_concurrent_saves_wait_for_the_lock(tmp_path, monkeypatch):
    """Two savers read the file at the same time; without the lock the later write would drop
    the other's document."""
    path = tmp_path / "s.store.safetensors"
    save_recycled_store(path, store_with((9, 10)), FP, "m")
    real_write = recycled_file.write_recycled_store

    def slow_write(target, data):
        time.sleep(0.3)  # widen the window between reading and writing
        real_write(target, data)

    monkeypatch.setattr(recycled_file, "write_recycled_store", slow_write)
    savers = [
        threading.Thread(target=save_recycled_store, args=(path, store_with((n, n * 100)), FP, "m")) for n in (1, 2)
    ]
    for saver in savers:
        saver.start()
    for saver in savers:
        saver.join()
    assert [stamp for stamp, _ in contents(read_recycled_store(path))] == [10, 100, 200]


WRITER = textwrap.dedent("""
    import sys, time
    from tr_cli.core.recycled_store import RecycledStore
    from tr_cli.store import recycled_file
    first, path = int(sys.argv[1]), sys.argv[2]
    store = RecycledStore(64)
    store.add([(first + i) % 64 for i in range(8)], first)
    real = recycled_file.write_recycled_store
    recycled_file.write_recycled_store = lambda target, data: (time.sleep(1.0), real(target, data))
    recycled_file.save_recycled_store(path, store, "abc", "m")
""")


@pytest.mark.slow  # two subprocesses
def test_two_processes_additions_both_land(tmp_path):
    path = tmp_path / "shared.store.safetensors"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(n), str(path)], env=env) for n in (11, 22)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert contents(read_recycled_store(path)) == [(11, tokens(11)), (22, tokens(22))]


def _file(tmp: Path, name: str, tensors: dict, metadata: dict | None = None) -> Path:
    meta = RecycledStoreMeta(VOCAB, FP, "m").to_strings() if metadata is None else metadata
    path = tmp / f"{name}.store.safetensors"
    save_file(tensors, str(path), metadata=meta)
    return path


def bad_files(tmp: Path) -> dict[str, Path]:
    good = tmp / "good.store.safetensors"
    write_recycled_store(
        good, RecycledStoreFile(RecycledStoreMeta(VOCAB, FP, "m"), store_with((1, 1), (2, 2)).documents)
    )
    raw = good.read_bytes()
    out = {}
    for name, content in {
        "empty": b"",
        "truncated": raw[: len(raw) // 2],
        "pickle": pickle.dumps({"tokens": [1, 2]}),
        "text": b"hello world, not a store",
    }.items():
        out[name] = tmp / f"{name}.store.safetensors"
        out[name].write_bytes(content)
    t = torch.arange(16, dtype=torch.int32)
    ends, stamps = torch.tensor([8, 16]), torch.tensor([1, 2])
    out["other tensors"] = _file(tmp, "other", {"weights": torch.zeros(3)})
    out["a matrix"] = _file(tmp, "matrix", {"matrix": torch.zeros(4, 2, dtype=torch.int32)})
    out["tokens int64"] = _file(tmp, "wide", {"tokens": t.long(), "ends": ends, "stamps": stamps})
    out["tokens 2-D"] = _file(tmp, "flat", {"tokens": t.reshape(2, 8), "ends": ends, "stamps": stamps})
    out["ends int32"] = _file(tmp, "ends32", {"tokens": t, "ends": ends.int(), "stamps": stamps})
    out["stamp count"] = _file(tmp, "stamps", {"tokens": t, "ends": ends, "stamps": torch.tensor([1])})
    out["ends decrease"] = _file(tmp, "order", {"tokens": t, "ends": torch.tensor([9, 8]), "stamps": stamps})
    out["empty document"] = _file(
        tmp, "hole", {"tokens": t, "ends": torch.tensor([8, 8, 16]), "stamps": stamps.repeat(2)[:3]}
    )
    out["ends short"] = _file(tmp, "short", {"tokens": t, "ends": torch.tensor([8, 12]), "stamps": stamps})
    out["tokens without ends"] = _file(
        tmp,
        "noends",
        {"tokens": t, "ends": torch.zeros(0, dtype=torch.int64), "stamps": torch.zeros(0, dtype=torch.int64)},
    )
    out["ids out of range"] = _file(tmp, "ids", {"tokens": t + VOCAB - 4, "ends": ends, "stamps": stamps})
    out["negative ids"] = _file(tmp, "neg", {"tokens": t - 1, "ends": ends, "stamps": stamps})
    good_tensors = {"tokens": t, "ends": ends, "stamps": stamps}
    newer = RecycledStoreMeta(VOCAB, FP, "m", format_version=FORMAT_VERSION + 1).to_strings()
    out["newer format"] = _file(tmp, "newer", good_tensors, newer)
    out["no metadata"] = _file(tmp, "nometa", good_tensors, {})
    out["bad capacity"] = _file(
        tmp, "capacity", good_tensors, RecycledStoreMeta(VOCAB, FP, "m", capacity=0).to_strings()
    )
    out["not a number"] = _file(
        tmp, "nan", good_tensors, {**RecycledStoreMeta(VOCAB, FP, "m").to_strings(), "vocab_size": "x"}
    )
    return out


KINDS = [
    "empty",
    "truncated",
    "pickle",
    "text",
    "other tensors",
    "a matrix",
    "tokens int64",
    "tokens 2-D",
    "ends int32",
    "stamp count",
    "ends decrease",
    "empty document",
    "ends short",
    "tokens without ends",
    "ids out of range",
    "negative ids",
    "newer format",
    "no metadata",
    "bad capacity",
    "not a number",
]


@pytest.mark.parametrize("kind", KINDS)
def test_unusable_files_are_refused_in_one_line_and_left_as_they_are(tmp_path, kind):
    path = bad_files(tmp_path)[kind]
    before = path.read_bytes()
    with pytest.raises(StoreFileError) as info:
        read_recycled_store(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    if kind == "newer format":
        assert "upgrade tr" in message
    assert path.read_bytes() == before


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(StoreFileError, match="no such recycled store file"):
        read_recycled_store(tmp_path / "nope.store.safetensors")


@pytest.mark.parametrize("kind", ["truncated", "text", "ids out of range"])
def test_an_unreadable_file_is_moved_aside_on_save(tmp_path, kind):
    path = tmp_path / "s.store.safetensors"
    bad = bad_files(tmp_path)[kind].read_bytes()
    path.write_bytes(bad)
    save_recycled_store(path, store_with((5, 100)), FP, "m")
    kept = list(tmp_path.glob("s.store.safetensors.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == bad
    assert contents(read_recycled_store(path)) == [(100, tokens(5))]


def test_another_tokenizers_store_is_refused(tmp_path):
    path = tmp_path / "s.store.safetensors"
    save_recycled_store(path, store_with((1, 100)), "other", "their-model")
    meta = read_recycled_store(path).meta
    with pytest.raises(StoreError, match="another tokenizer") as info:
        check_recycled_store_compatible(meta, FP, VOCAB, path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(StoreError, match="vocabulary of 64"):
        check_recycled_store_compatible(meta, "other", 128, path)
    # A save onto it is refused too, and the file stays as it was.
    before = path.read_bytes()
    store = store_with((2, 200))
    with pytest.raises(StoreError, match="another tokenizer"):
        save_recycled_store(path, store, FP, "m")
    assert path.read_bytes() == before and len(store.added) == 1  # kept for a later try


def test_a_save_starts_from_the_fallback_when_there_is_no_file(tmp_path):
    seed = tmp_path / "seed.store.safetensors"
    write_recycled_store(seed, RecycledStoreFile(RecycledStoreMeta(VOCAB, FP, "m"), store_with((1, 100)).documents))
    before = seed.read_bytes()
    path = tmp_path / "mine.store.safetensors"
    save_recycled_store(path, store_with((2, 200)), FP, "m", fallback=seed)
    assert contents(read_recycled_store(path)) == [(100, tokens(1)), (200, tokens(2))]
    assert seed.read_bytes() == before
    # Once the user's file exists, the fallback is not read again.
    save_recycled_store(path, store_with((3, 300)), FP, "m", fallback=tmp_path / "gone.store.safetensors")
    assert len(read_recycled_store(path).documents) == 3
