"""A matrix file and its recycled store as one pair (real files in a temp dir): which files go
together, the lock order when both are held, what a rebuild refuses to overwrite, writing a pair
built from text."""

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tr_cli.errors import StoreError
from tr_cli.store.atomic import locked
from tr_cli.store.matrix_file import MatrixFile, MatrixOwner, read_matrix, write_matrix
from tr_cli.store.matrix_pair import (
    check_rebuild,
    is_recycled_store_name,
    matrix_path_of,
    pair_locked,
    pair_paths,
    write_built_matrix,
    write_corpus_recycled_store,
)
from tr_cli.store.recycled_file import (
    RecycledStoreFile,
    RecycledStoreMeta,
    read_recycled_store,
    recycled_store_path,
    write_recycled_store,
)
from tr_cli.store.remedies import FixableError, Remedy

from fake_tokenizer import VOCAB, K

OWNER = MatrixOwner("abc", VOCAB, K, "model-x")


def test_the_pair_and_its_names(tmp_path):
    matrix = tmp_path / "abc-v64-k4.safetensors"
    assert pair_paths(matrix) == (matrix, tmp_path / "abc-v64-k4.store.safetensors")
    assert matrix_path_of(recycled_store_path(matrix)) == matrix
    assert matrix_path_of("out.store.safetensors") == Path("out.safetensors")
    assert is_recycled_store_name(recycled_store_path(matrix)) and not is_recycled_store_name(matrix)


def test_pair_locked_holds_both_locks(tmp_path):
    matrix = tmp_path / "m.safetensors"
    with pair_locked(matrix):
        for path in pair_paths(matrix):
            with pytest.raises(StoreError, match="held"), locked(path, timeout=0.1):
                pass
    with locked(matrix, timeout=0.1), locked(recycled_store_path(matrix), timeout=0.1):
        pass  # both released


def test_pair_locked_without_a_recycled_store_leaves_its_lock_alone(tmp_path):
    matrix = tmp_path / "m.safetensors"
    with pair_locked(matrix, with_recycled_store=False):
        with locked(recycled_store_path(matrix), timeout=0.1):
            pass
        with pytest.raises(StoreError), locked(matrix, timeout=0.1):
            pass


def test_the_recycled_stores_lock_is_taken_first(tmp_path):
    """While the matrix's lock is held elsewhere, pair_locked already holds the recycled store's:
    every holder of both takes them in this order, so none waits on another holding the other."""
    matrix = tmp_path / "m.safetensors"
    holding, entered = threading.Event(), threading.Event()

    def hold_matrix():
        with locked(matrix):
            holding.set()
            time.sleep(0.6)

    def take_pair():
        with pair_locked(matrix):
            entered.set()

    holder = threading.Thread(target=hold_matrix)
    holder.start()
    assert holding.wait(5)
    taker = threading.Thread(target=take_pair)
    taker.start()
    time.sleep(0.2)
    assert not entered.is_set()  # waiting for the matrix...
    with pytest.raises(StoreError), locked(recycled_store_path(matrix), timeout=0.1):
        pass  # ...with the recycled store's lock taken
    holder.join()
    taker.join()
    assert entered.is_set()


def test_a_rebuild_refuses_either_file_of_the_pair(tmp_path):
    matrix = tmp_path / "m.safetensors"
    check_rebuild(matrix)  # nothing there
    write_recycled_store(recycled_store_path(matrix), RecycledStoreFile(RecycledStoreMeta(VOCAB, "abc", "x"), []))
    with pytest.raises(FixableError) as info:
        check_rebuild(matrix)
    assert info.value.remedies == (Remedy.OVERWRITE,)
    assert str(info.value) == f"{recycled_store_path(matrix)}: a recycled store already exists; overwrite it"
    data = MatrixFile.empty(VOCAB, K, "abc", "x")
    data.meta = replace(data.meta, update_count=1234)
    write_matrix(matrix, data)
    with pytest.raises(FixableError, match=r"m.safetensors: a matrix already exists \(1,234 row updates, last "):
        check_rebuild(matrix)
    matrix.write_bytes(b"junk")
    with pytest.raises(FixableError, match=r"a matrix already exists \(unreadable\); overwrite it"):
        check_rebuild(matrix)
    check_rebuild(matrix, overwrite=True)


def test_a_built_matrix_stamps_its_filled_rows(tmp_path):
    path = tmp_path / "m.safetensors"
    built = torch.zeros(VOCAB, K, dtype=torch.int32)
    built[3] = torch.tensor([1, 2, 3, 4])
    built[9] = 5
    before = time.time_ns() // 1000
    data = write_built_matrix(path, built, OWNER)
    back = read_matrix(path)
    assert torch.equal(back.matrix, built) and torch.equal(back.stamps, data.stamps)
    assert back.meta.update_count == 2 and back.meta.model_id == "model-x" and back.meta.fingerprint == "abc"
    assert (back.stamps[[3, 9]] >= before).all() and int(back.stamps.count_nonzero()) == 2


def test_a_corpus_recycled_store_keeps_every_text_in_order(tmp_path):
    path = tmp_path / "m.safetensors"
    texts = [list(range(10)), [1, 2], list(range(20, 40)), list(range(10))]  # [1, 2]: too short to keep
    target, data = write_corpus_recycled_store(path, texts, OWNER)
    assert target == recycled_store_path(path)
    back = read_recycled_store(target)
    assert [doc.tokens.tolist() for doc in back.documents] == [texts[0], texts[2], texts[3]]
    stamps = [doc.stamp for doc in back.documents]
    assert stamps == sorted(set(stamps))  # distinct: a later merge keeps the repeated text too
    assert back.meta == data.meta and back.meta.model_id == "model-x"
