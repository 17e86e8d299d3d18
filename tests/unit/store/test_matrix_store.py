"""Matrix files: round trips, validation, atomic writes, merging and concurrent saves."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tr_cli.errors import StoreError
from tr_cli.store import atomic, matrix_file
from tr_cli.store.hot_matrix import HotMatrix
from tr_cli.store.matrix_file import MatrixFile, MatrixFileError, read_matrix, write_matrix
from tr_cli.store.paths import matrices_dir

from fake_tokenizer import VOCAB, FakeTokenizer, K


def sample_file(seed: int = 0) -> MatrixFile:
    g = torch.Generator().manual_seed(seed)
    data = MatrixFile.empty(VOCAB, K, "abc", "model-x")
    data.matrix = torch.randint(0, VOCAB, (VOCAB, K), generator=g, dtype=torch.int32)
    data.stamps = torch.randint(1, 10**6, (VOCAB,), generator=g, dtype=torch.int64)
    return data


def test_tr_home_moves_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TR_HOME", str(tmp_path))
    assert matrices_dir() == tmp_path / "data" / "matrices"
    assert matrix_file.default_path("f", 10, 8).parent == tmp_path / "data" / "matrices"


def test_matrix_file_paths_leave_out_what_is_not_a_matrix_file(tmp_path):
    for name in ("b-v1-k8.safetensors", "a-v1-k8.safetensors", "a-v1-k8.store.safetensors", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "folder.safetensors").mkdir()
    assert matrix_file.matrix_file_paths(tmp_path) == [
        tmp_path / "a-v1-k8.safetensors",
        tmp_path / "b-v1-k8.safetensors",
    ]
    assert matrix_file.matrix_file_paths(tmp_path / "missing") == []


def test_round_trip_is_bit_identical(tmp_path):
    data = sample_file()
    write_matrix(tmp_path / "m.safetensors", data)
    back = read_matrix(tmp_path / "m.safetensors")
    assert torch.equal(back.matrix, data.matrix) and torch.equal(back.stamps, data.stamps)
    assert back.meta == data.meta
    matrix_file.copy_matrix_file(tmp_path / "m.safetensors", tmp_path / "copy.safetensors")
    assert (tmp_path / "m.safetensors").read_bytes() == (tmp_path / "copy.safetensors").read_bytes()


def test_fingerprint_depends_on_vocabulary_and_specials():
    a, b = FakeTokenizer(), FakeTokenizer(shift=1)
    assert matrix_file.tokenizer_fingerprint(a) == matrix_file.tokenizer_fingerprint(FakeTokenizer())
    assert matrix_file.tokenizer_fingerprint(a) != matrix_file.tokenizer_fingerprint(b)
    c = FakeTokenizer()
    c.special_tokens_map = {"eos_token": "tok3"}
    assert matrix_file.tokenizer_fingerprint(a) != matrix_file.tokenizer_fingerprint(c)


def bad_files(tmp: Path) -> dict[str, Path]:
    good = tmp / "good.safetensors"
    write_matrix(good, sample_file())
    raw = good.read_bytes()
    files = {
        "empty": b"",
        "truncated": raw[: len(raw) // 2],
        "pickle": pickle.dumps({"matrix": [[1, 2]]}),
        "text": b"hello world, not a matrix",
    }
    out = {}
    for name, content in files.items():
        (tmp / f"{name}.safetensors").write_bytes(content)
        out[name] = tmp / f"{name}.safetensors"
    from safetensors.torch import save_file

    save_file({"weights": torch.zeros(3)}, str(tmp / "other.safetensors"))
    out["other tensors"] = tmp / "other.safetensors"
    bad_ids = sample_file()
    bad_ids.matrix[0, 0] = VOCAB + 5
    write_matrix(tmp / "ids.safetensors", bad_ids)
    out["ids out of range"] = tmp / "ids.safetensors"
    return out


@pytest.mark.parametrize("kind", ["empty", "truncated", "pickle", "text", "other tensors", "ids out of range"])
def test_unusable_files_are_refused_with_their_name(tmp_path, kind):
    path = bad_files(tmp_path)[kind]
    with pytest.raises(MatrixFileError) as info:
        read_matrix(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_crash_before_rename_leaves_old_file_valid(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    old = sample_file(1)
    write_matrix(path, old)
    monkeypatch.setattr(atomic.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("power cut")))
    with pytest.raises(OSError):
        write_matrix(path, sample_file(2))
    assert torch.equal(read_matrix(path).matrix, old.matrix)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temp file left behind


def test_merge_keeps_newer_rows():
    a, b = sample_file(1), sample_file(2)
    merged = a.merged_with(b)
    for row in range(VOCAB):
        winner = b if b.stamps[row] > a.stamps[row] else a
        assert torch.equal(merged.matrix[row], winner.matrix[row])
    assert torch.equal(merged.stamps, torch.maximum(a.stamps, b.stamps))


def test_hot_matrix_saves_only_changed_rows_merged(tmp_path):
    path = tmp_path / "m.safetensors"
    tok = FakeTokenizer()
    first = HotMatrix.open(tok, VOCAB, "m", k=K, path=path)
    assert first.state == "new"
    first.matrix[5] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    assert first.save().rows == 1
    # A second session loads it hot, and a third writer changes another row meanwhile.
    second = HotMatrix.open(tok, VOCAB, "m", k=K, path=path)
    assert second.state == "hot" and second.matrix[5].tolist() == [1, 2, 3, 4]
    third = HotMatrix.open(tok, VOCAB, "m", k=K, path=path)
    third.matrix[9] = 7
    third.save()
    second.matrix[6] = 8
    assert second.save().rows == 1
    final = read_matrix(path)
    assert final.matrix[5].tolist() == [1, 2, 3, 4]
    assert final.matrix[9].tolist() == [7] * K and final.matrix[6].tolist() == [8] * K
    assert final.meta.update_count == 3


def test_hot_matrix_refuses_another_tokenizers_matrix(tmp_path):
    path = tmp_path / "m.safetensors"
    session = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path)
    session.matrix[1] = 1
    session.save()
    with pytest.raises(StoreError, match="another tokenizer"):
        HotMatrix.open(FakeTokenizer(shift=3), VOCAB, "m", k=K, path=path)
    with pytest.raises(StoreError, match="64x4 but this model needs 64x8"):
        HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=8, path=path)


def test_cold_and_no_save(tmp_path):
    path = tmp_path / "m.safetensors"
    session = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path)
    session.matrix[3] = 3
    session.save()
    cold = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path, cold=True, save=False)
    assert cold.state == "cold" and not cold.matrix.any()
    cold.matrix[4] = 4
    assert cold.save().rows == 0
    assert read_matrix(path).matrix[4].tolist() == [0] * K


def test_corrupt_matrix_file_is_an_error_not_overwritten(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"garbage")
    with pytest.raises(StoreError, match="not a valid tr matrix file"):
        HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path)
    assert path.read_bytes() == b"garbage"


WRITER = textwrap.dedent("""
    import importlib.util, sys, time, torch
    spec = importlib.util.spec_from_file_location("store_test", {module!r})
    store_test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(store_test)
    FakeTokenizer, VOCAB, K = store_test.FakeTokenizer, store_test.VOCAB, store_test.K
    from tr_cli.store.hot_matrix import HotMatrix
    row = int(sys.argv[1])
    session = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=sys.argv[2])
    session.matrix[row] = row
    time.sleep(float(sys.argv[3]))
    session.save()
""")


@pytest.mark.slow  # two subprocesses
def test_concurrent_saves_from_two_processes_both_land(tmp_path):
    path = tmp_path / "shared.safetensors"
    script = WRITER.format(module=str(Path(__file__)))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(row), str(path), "1.0"], env=env) for row in (11, 22)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    final = read_matrix(path)
    assert final.matrix[11].tolist() == [11] * K
    assert final.matrix[22].tolist() == [22] * K


def test_hot_matrix_carries_its_acceptance_statistics(tmp_path):
    from tr_cli.core import TreeBuffers, TreeSpec

    path = tmp_path / "m.safetensors"
    first = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path)
    assert first.acceptance is not None and first.acceptance.observed_steps == 0
    buffers = TreeBuffers.build(TreeSpec.from_paths("t", [[0], [1], [0, 0]]))
    for _ in range(3):
        first.acceptance.record(buffers, torch.tensor([True, True, False, True]))
    first.matrix[2] = 1
    first.save()
    assert (tmp_path / "m.accept.json").exists()
    second = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path)
    assert second.acceptance.to_dict() == first.acceptance.to_dict()
    cold = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path, cold=True, save=False)
    assert cold.acceptance.observed_steps == 0


def tokenizer_dir(directory: Path, extra: tuple[str, ...] = ()):
    """A small real tokenizer saved to `directory` and read back from it, as a model's is."""
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["a", "b", "c", "ab", *extra])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="c").save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def test_fingerprint_is_remembered_per_version_of_the_tokenizer_files(tmp_path, monkeypatch):
    def fresh(tokenizer) -> str:  # computed in a home with nothing remembered
        monkeypatch.setenv("TR_HOME", str(tmp_path / f"fresh-{len(list(tmp_path.glob('fresh-*')))}"))
        value = matrix_file.tokenizer_fingerprint(tokenizer)
        monkeypatch.setenv("TR_HOME", str(tmp_path / "home"))
        return value

    monkeypatch.setenv("TR_HOME", str(tmp_path / "home"))
    memo = tmp_path / "home" / "cache" / "fingerprints.json"
    tokenizer = tokenizer_dir(tmp_path / "tokenizer")
    first = matrix_file.tokenizer_fingerprint(tokenizer)
    assert first == fresh(tokenizer) and list(json.loads(memo.read_text()).values()) == [first]
    # Read from the memo while the files are unchanged (a planted value shows it is read) ...
    key = next(iter(json.loads(memo.read_text())))
    memo.write_text(json.dumps({key: "planted"}))
    assert matrix_file.tokenizer_fingerprint(tokenizer) == "planted"
    # ... never once they change: another vocabulary in the same directory is hashed again.
    memo.write_text(json.dumps({key: first}))
    other = tokenizer_dir(tmp_path / "tokenizer", extra=("d",))
    assert matrix_file.tokenizer_fingerprint(other) == fresh(other) != first
    # A damaged memo is only a slower start.
    memo.write_text("not json")
    assert matrix_file.tokenizer_fingerprint(other) == fresh(other)
    assert len(json.loads(memo.read_text())) == 1
    # A tokenizer not read from a directory is hashed each time and not remembered.
    assert matrix_file.tokenizer_fingerprint(FakeTokenizer()) == fresh(FakeTokenizer())
    assert len(json.loads(memo.read_text())) == 1
