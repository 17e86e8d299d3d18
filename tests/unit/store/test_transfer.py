"""Export and import of a matrix file with its recycled store (real files in a temp data dir):
exact copies out, merges or replacements in, and every refusal made before anything is written."""

import os
from pathlib import Path

import pytest
import torch

from tr_cli.errors import MatrixFileError, StoreError, StoreFileError, UserError
from tr_cli.store.matrix_file import MatrixFile, MatrixOwner, read_matrix, write_matrix
from tr_cli.store.recycled_file import (
    RecycledStoreFile,
    RecycledStoreMeta,
    read_recycled_store,
    recycled_store_path,
    write_recycled_store,
)
from tr_cli.store.remedies import Remedy
from tr_cli.store.transfer import check_export_target, export_pair, plan_import, read_import

from fake_tokenizer import VOCAB, K

OWNER = MatrixOwner("abc", VOCAB, K, "model-x")


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TR_HOME", str(tmp_path / "home"))


def matrix_with(row: int, stamp: int, fingerprint: str = "abc", k: int = K, vocab: int = VOCAB) -> MatrixFile:
    data = MatrixFile.empty(vocab, k, fingerprint, "m")
    data.matrix[row] = row
    data.stamps[row] = stamp
    return data


def recycled_with(*firsts: int, fingerprint: str = "abc", vocab: int = VOCAB) -> RecycledStoreFile:
    from tr_cli.core.recycled_store import Document

    documents = [Document(torch.arange(first, first + 8) % vocab, first) for first in firsts]
    return RecycledStoreFile(RecycledStoreMeta(vocab, fingerprint, "m"), documents)


def write_pair(matrix_path: Path, matrix: MatrixFile, recycled: RecycledStoreFile | None = None) -> Path:
    write_matrix(matrix_path, matrix)
    if recycled is not None:
        write_recycled_store(recycled_store_path(matrix_path), recycled)
    return matrix_path


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()} if directory.exists() else {}


def same_matrix(a: Path, b: Path) -> bool:
    first, second = read_matrix(a), read_matrix(b)
    return torch.equal(first.matrix, second.matrix) and torch.equal(first.stamps, second.stamps)


def documents(path: Path) -> list[int]:
    return [doc.stamp for doc in read_recycled_store(path).documents]


# --- export ---------------------------------------------------------------------------------------


def test_an_export_target_must_be_new_named_as_a_matrix_in_a_directory(tmp_path):
    output = tmp_path / "out.safetensors"
    check_export_target(output)
    recycled_store_path(output).write_bytes(b"")
    with pytest.raises(StoreError) as info:
        check_export_target(output)
    assert info.value.remedies == (Remedy.OVERWRITE,) and str(recycled_store_path(output)) in str(info.value)
    check_export_target(output, overwrite=True)
    for name in ("other.bin", "other.store.safetensors"):
        with pytest.raises(UserError, match=r"matrix files end in \.safetensors; name it e\.g\. "):
            check_export_target(tmp_path / name)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UserError, match="a-file is not a directory; export to an existing directory"):
        check_export_target(tmp_path / "a-file" / "m.safetensors")


def test_export_copies_the_pair_byte_for_byte(tmp_path):
    stored = write_pair(OWNER.default_path, matrix_with(3, 30), recycled_with(1, 2))
    output = tmp_path / "out.safetensors"
    exported = export_pair(stored, output)
    assert output.read_bytes() == stored.read_bytes()
    assert recycled_store_path(output).read_bytes() == recycled_store_path(stored).read_bytes()
    assert exported.recycled_store_path == recycled_store_path(output)
    assert exported.matrix.rows_filled == 1 and len(exported.recycled_store.documents) == 2


def test_export_without_a_recycled_store_removes_a_stale_one_beside_the_output(tmp_path):
    stored = write_pair(OWNER.default_path, matrix_with(3, 30))
    output = tmp_path / "out.safetensors"
    write_recycled_store(recycled_store_path(output), recycled_with(5))  # from an earlier export
    exported = export_pair(stored, output)
    assert exported.recycled_store is None and not recycled_store_path(output).exists()
    assert not recycled_store_path(stored).with_name(recycled_store_path(stored).name + ".lock").exists()


@pytest.mark.parametrize("damaged", ["matrix", "recycled store"])
def test_a_damaged_stored_file_is_refused_before_anything_is_written(tmp_path, damaged):
    stored = write_pair(OWNER.default_path, matrix_with(3, 30), recycled_with(1))
    (stored if damaged == "matrix" else recycled_store_path(stored)).write_bytes(b"junk")
    output = tmp_path / "out.safetensors"
    with pytest.raises(MatrixFileError if damaged == "matrix" else StoreFileError) as info:
        export_pair(stored, output)
    assert f"the stored {damaged} is damaged" in str(info.value)
    assert info.value.remedies == ((Remedy.REBUILD,) if damaged == "matrix" else (Remedy.EXPORT_ALONE,))
    assert not output.exists() and not recycled_store_path(output).exists()


def test_an_output_nobody_can_write_is_one_line_naming_it():
    stored = write_pair(OWNER.default_path, matrix_with(3, 30))
    with pytest.raises(StoreError) as info:
        export_pair(stored, Path("/proc/m.safetensors"))  # the kernel's: no file can be made there
    assert str(info.value).startswith("/proc/m.safetensors: cannot write it (")
    assert str(info.value).endswith("; export to a writable directory")


# --- import ---------------------------------------------------------------------------------------


def test_an_unreadable_import_names_what_was_left_alone(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(MatrixFileError, match="not a valid tr matrix file .*; the stored matrix was left untouched"):
        read_import(tmp_path / "junk.safetensors")


@pytest.mark.parametrize("kind", ["folder", "device", "fifo"])
def test_an_import_that_is_there_but_not_a_file_is_not_called_missing(tmp_path, kind):
    # `tr matrix import /dev/zero` said "no such matrix file"
    path = {"folder": tmp_path, "device": Path("/dev/zero"), "fifo": tmp_path / "pipe"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(MatrixFileError) as info:
        read_import(path)
    what = "a folder" if kind == "folder" else "a device or FIFO"
    assert str(info.value) == f"{path}: {what}, not a tr matrix file; the stored matrix was left untouched"


def test_a_first_import_stores_the_pair_then_merges_then_replaces(tmp_path):
    source = write_pair(tmp_path / "in.safetensors", matrix_with(3, 30), recycled_with(1, 2))
    planned = plan_import(source, read_import(source), OWNER)
    assert planned.target == OWNER.default_path
    assert planned.write_matrix()[0] == "stored" and planned.write_recycled_store()[0] == "stored"
    assert same_matrix(OWNER.default_path, source)
    assert documents(recycled_store_path(OWNER.default_path)) == [1, 2]

    # Merged: per row the newer stamp wins; conversations already held are not doubled.
    write_pair(source, matrix_with(3, 10).merged_with(matrix_with(7, 70)), recycled_with(2, 5))
    planned = plan_import(source, read_import(source), OWNER)
    how, merged = planned.write_matrix()
    assert how == "merged" and merged.matrix[3].tolist() == [3] * K and merged.matrix[7].tolist() == [7] * K
    assert read_matrix(OWNER.default_path).stamps[3] == 30  # the stored row was newer
    assert planned.write_recycled_store()[0] == "merged"
    assert documents(recycled_store_path(OWNER.default_path)) == [1, 2, 5]

    # Replaced: exactly the imported pair.
    write_pair(source, matrix_with(9, 1), recycled_with(6))
    planned = plan_import(source, read_import(source), OWNER, replace_stored=True)
    assert planned.write_matrix()[0] == "replaced" and planned.write_recycled_store()[0] == "replaced"
    assert read_matrix(OWNER.default_path).rows_filled == 1
    assert documents(recycled_store_path(OWNER.default_path)) == [6]


def test_an_import_without_a_recycled_store_leaves_the_stored_one(tmp_path):
    write_pair(OWNER.default_path, matrix_with(3, 30), recycled_with(1))
    source = write_pair(tmp_path / "in.safetensors", matrix_with(4, 40))
    planned = plan_import(source, read_import(source), OWNER, replace_stored=True)
    planned.write_matrix()
    assert planned.write_recycled_store() is None and documents(recycled_store_path(OWNER.default_path)) == [1]


@pytest.mark.parametrize(
    "case, remedies, words",
    [
        ("another k", (Remedy.MATRIX_K,), "matrix is 64×8, model-x needs 64×4; not imported"),
        ("another vocabulary", (), "matrix is 32×4, model-x needs 64×4; not imported"),
        ("another tokenizer", (Remedy.ANY_TOKENIZER,), "written for another tokenizer (fingerprint xyz, model m; "),
        ("damaged recycled store", None, "not a valid tr recycled store file"),
        ("recycled store of another tokenizer", (Remedy.ANY_TOKENIZER,), "written for another tokenizer"),
        ("recycled store of another vocabulary", None, "recycled store is for a vocabulary of 32, model-x has 64"),
        ("damaged stored recycled store", (Remedy.REPLACE,), "the stored recycled store is damaged"),
    ],
)
def test_a_refused_import_writes_nothing(tmp_path, case, remedies, words):
    stored = write_pair(OWNER.default_path, matrix_with(3, 30), recycled_with(1))
    source = tmp_path / "in.safetensors"
    matrix = {
        "another k": matrix_with(3, 40, k=8),
        "another vocabulary": matrix_with(3, 40, vocab=32),
        "another tokenizer": matrix_with(3, 40, fingerprint="xyz"),
    }.get(case, matrix_with(3, 40))
    recycled = {
        "recycled store of another tokenizer": recycled_with(2, fingerprint="xyz"),
        "recycled store of another vocabulary": recycled_with(2, vocab=32),
    }.get(case, recycled_with(2))
    write_pair(source, matrix, recycled)
    if case == "damaged recycled store":
        recycled_store_path(source).write_bytes(b"junk")
    if case == "damaged stored recycled store":
        recycled_store_path(stored).write_bytes(b"junk")
    before = snapshot(stored.parent)
    with pytest.raises(StoreError) as info:
        plan_import(source, read_import(source), OWNER)
    assert words in str(info.value) and "\n" not in str(info.value)
    if remedies is not None:
        assert info.value.remedies == remedies
    else:
        assert str(info.value).endswith("; nothing was imported")
    assert snapshot(stored.parent) == before


def test_any_tokenizer_takes_the_pairs_ids_as_the_owners(tmp_path):
    source = write_pair(tmp_path / "in.safetensors", matrix_with(3, 40, "xyz"), recycled_with(2, fingerprint="xyz"))
    planned = plan_import(source, read_import(source), OWNER, any_tokenizer=True)
    planned.write_matrix()
    planned.write_recycled_store()
    assert read_matrix(OWNER.default_path).meta.fingerprint == "abc"
    assert read_recycled_store(recycled_store_path(OWNER.default_path)).meta.fingerprint == "abc"


def test_a_damaged_stored_matrix_is_refused_when_merging_and_replaced_on_request(tmp_path):
    OWNER.default_path.parent.mkdir(parents=True)
    OWNER.default_path.write_bytes(b"junk")
    source = write_pair(tmp_path / "in.safetensors", matrix_with(3, 40))
    with pytest.raises(MatrixFileError, match="the stored matrix is damaged") as info:
        plan_import(source, read_import(source), OWNER).write_matrix()
    assert info.value.remedies == (Remedy.REPLACE,) and OWNER.default_path.read_bytes() == b"junk"
    assert plan_import(source, read_import(source), OWNER, replace_stored=True).write_matrix()[0] == "replaced"
    assert same_matrix(OWNER.default_path, source)
