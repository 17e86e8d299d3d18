"""The hot state a command starts from: the recycled store beside the matrix (open, fork, save,
--cold, --no-save, a bad file, one part's failed save not costing the other) and the starter
files shipped with tr for new users."""

import json
import re
from dataclasses import replace

import pytest
import torch

from tr_cli.core import TreeBuffers, TreeSpec
from tr_cli.core.design.acceptance_stats import AcceptanceStats
from tr_cli.errors import MatrixFileError, StoreError, StoreFileError
from tr_cli.store.acceptance_file import acceptance_path
from tr_cli.store.hot_matrix import SAVE_TARGET, STARTER, UNREADABLE, HotMatrix, Saved
from tr_cli.store.matrix_file import MatrixFile, default_path, read_matrix, tokenizer_fingerprint, write_matrix
from tr_cli.store.paths import seed_dir
from tr_cli.store.recycled_file import (
    RecycledStoreFile,
    RecycledStoreMeta,
    read_recycled_store,
    recycled_store_path,
    write_recycled_store,
)
from tr_cli.store.remedies import Remedy

from fake_tokenizer import VOCAB, FakeTokenizer, K

FP = tokenizer_fingerprint(FakeTokenizer())


def conversation(first: int, n: int = 10) -> list[int]:
    return [(first + i) % VOCAB for i in range(n)]


def open_hot(path=None, **kwargs) -> HotMatrix:
    return HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path, **kwargs)


def assert_one_line_without_flags(message: str) -> None:
    """The store does not know how it was called: the command line words the remedies as flags."""
    assert "\n" not in message and not re.search(r"(^|\s)--[a-z]", message), message


def stored(path) -> list[list[int]]:
    return [doc.tokens.tolist() for doc in read_recycled_store(recycled_store_path(path)).documents]


def test_the_store_is_saved_beside_the_matrix_and_loaded_with_it(tmp_path):
    path = tmp_path / "m.safetensors"
    first = open_hot(path)
    assert first.store.documents == [] and "+ store" not in first.describe()
    first.store.add(conversation(1), 100)
    first.matrix[3] = 1
    assert first.save() == Saved(rows=1, documents=1, tokens=10)
    assert first.store.added == [] and stored(path) == [conversation(1)]
    assert first.save() == Saved()  # nothing new
    second = open_hot(path)
    assert second.state == "hot" and [d.tokens.tolist() for d in second.store.documents] == [conversation(1)]
    assert second.describe().endswith("+ store of 10 tokens in 1 conversation")


def test_a_store_without_its_matrix_is_still_loaded_and_saved(tmp_path):
    """A conversation may change no matrix row: the store is written alone, and read back."""
    path = tmp_path / "m.safetensors"
    first = open_hot(path)
    first.store.add(conversation(5), 100)
    assert first.save() == Saved(rows=0, documents=1, tokens=10)
    assert not path.exists() and recycled_store_path(path).exists()
    again = open_hot(path)
    assert again.state == "new" and len(again.store.documents) == 1


def test_two_sessions_keep_each_others_conversations(tmp_path):
    path = tmp_path / "m.safetensors"
    first, second = open_hot(path), open_hot(path)
    first.store.add(conversation(1), 100)
    second.store.add(conversation(2), 200)
    second.save()
    first.save()
    assert stored(path) == [conversation(1), conversation(2)]


def test_a_fork_has_its_own_store_and_never_saves(tmp_path):
    path = tmp_path / "m.safetensors"
    hot = open_hot(path)
    hot.store.add(conversation(1), 100)
    hot.save()
    fork = hot.fork()
    assert fork.store is not hot.store and fork.store.total_tokens == 10
    fork.store.add(conversation(2), 200)
    assert hot.store.total_tokens == 10
    assert fork.save() == Saved() and stored(path) == [conversation(1)]


def test_cold_starts_empty_and_no_save_writes_nothing(tmp_path):
    path = tmp_path / "m.safetensors"
    hot = open_hot(path)
    hot.store.add(conversation(1), 100)
    hot.save()
    before = recycled_store_path(path).read_bytes()
    cold = open_hot(path, cold=True, save=False)
    assert cold.state == "cold" and cold.store.documents == []
    cold.store.add(conversation(2), 200)
    assert cold.save() == Saved()
    unsaved = open_hot(path, save=False)
    assert len(unsaved.store.documents) == 1
    unsaved.store.add(conversation(3), 300)
    assert unsaved.save() == Saved() and recycled_store_path(path).read_bytes() == before
    # --cold with saving: starts empty, then merges its conversations into the file.
    cold_saving = open_hot(path, cold=True)
    cold_saving.store.add(conversation(4), 400)
    cold_saving.save()
    assert stored(path) == [conversation(1), conversation(4)]


def test_a_bad_store_file_is_an_error_at_start_and_left_intact(tmp_path):
    path = tmp_path / "m.safetensors"
    open_hot(path).matrix[1] = 1
    recycled_store_path(path).write_bytes(b"not a store")
    with pytest.raises(StoreFileError) as info:
        open_hot(path)
    message = str(info.value)
    assert str(recycled_store_path(path)) in message and "not a valid tr recycled store file" in message
    assert info.value.remedies == UNREADABLE == (Remedy.MOVE_AWAY, Remedy.OTHER_MATRIX, Remedy.COLD)
    assert message.endswith("; move it away, use another matrix file, or start from an empty matrix")
    assert_one_line_without_flags(message)
    assert recycled_store_path(path).read_bytes() == b"not a store"
    assert open_hot(path, cold=True, save=False).store.documents == []  # --cold does not read it
    # ...but --cold saves into it at exit, so with saving on it is refused as well.
    with pytest.raises(StoreFileError, match="; a cold start saves into it at exit; ") as info:
        open_hot(path, cold=True)
    assert info.value.remedies == SAVE_TARGET and Remedy.NO_SAVE in SAVE_TARGET
    assert_one_line_without_flags(str(info.value))
    assert recycled_store_path(path).read_bytes() == b"not a store"


def test_another_tokenizers_store_is_refused_at_start(tmp_path):
    path = tmp_path / "m.safetensors"
    write_recycled_store(
        recycled_store_path(path), RecycledStoreFile(RecycledStoreMeta(VOCAB, "someone-else", "x"), [])
    )
    with pytest.raises(StoreError, match="another tokenizer"):
        open_hot(path)


def test_a_failed_store_save_keeps_the_matrix_save(tmp_path):
    path = tmp_path / "m.safetensors"
    hot = open_hot(path)
    # Another tokenizer's store appeared meanwhile: the store part is refused, the matrix saved.
    write_recycled_store(
        recycled_store_path(path), RecycledStoreFile(RecycledStoreMeta(VOCAB, "someone-else", "x"), [])
    )
    before = recycled_store_path(path).read_bytes()
    hot.matrix[7] = 7
    hot.store.add(conversation(1), 100)
    with pytest.raises(StoreError) as info:
        hot.save()
    assert "store to" in str(info.value) and "matrix to" not in str(info.value)
    assert read_matrix(path).matrix[7].tolist() == [7] * K
    assert recycled_store_path(path).read_bytes() == before and len(hot.store.added) == 1


def test_a_failed_matrix_save_keeps_the_store_save(tmp_path):
    path = tmp_path / "m.safetensors"
    hot = open_hot(path)
    write_matrix(path, MatrixFile.empty(VOCAB, 8, FP, "m"))  # rewritten meanwhile with another k
    hot.matrix[7] = 7
    hot.store.add(conversation(1), 100)
    with pytest.raises(StoreError) as info:
        hot.save()
    assert "matrix to" in str(info.value) and "store to" not in str(info.value)
    assert stored(path) == [conversation(1)]


@pytest.fixture()
def seeds(home, tmp_path):
    """A starter directory holding a matrix (row 5 filled), its store and its statistics, named
    as the fake tokenizer's default matrix."""
    directory = tmp_path / "seed"
    name = default_path(FP, VOCAB, K).name
    data = MatrixFile.empty(VOCAB, K, FP, "starter-model")
    data.matrix[5] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    data.stamps[5] = 1
    data.meta = replace(data.meta, update_count=1)
    write_matrix(directory / name, data)
    documents = starter_store().documents
    write_recycled_store(
        recycled_store_path(directory / name),
        RecycledStoreFile(RecycledStoreMeta(VOCAB, FP, "starter-model"), documents),
    )
    hot = HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=tmp_path / "stats.safetensors")
    buffers = TreeBuffers.build(TreeSpec.from_paths("t", [[0], [1]]))
    hot.acceptance.record(buffers, torch.tensor([True, True, False]))
    acceptance_path(directory / name).write_text(json.dumps(hot.acceptance.to_dict()))
    return directory


def starter_store():
    from tr_cli.core.recycled_store import RecycledStore

    store = RecycledStore(VOCAB)
    store.add(conversation(40), 50)
    return store


def snapshot(directory):
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def test_a_new_user_starts_from_the_starter_files(seeds):
    before = snapshot(seeds)
    hot = open_hot(seeds=seeds)
    assert hot.state == "seeded" and hot.seed == seeds / hot.path.name
    assert hot.path == default_path(FP, VOCAB, K) and not hot.path.exists()
    assert hot.matrix[5].tolist() == [1, 2, 3, 4] and hot.start_update_count == 1
    assert [d.tokens.tolist() for d in hot.store.documents] == [conversation(40)]
    assert hot.acceptance.observed_steps == 1
    assert hot.describe().startswith("starter matrix shipped with tr") and str(hot.path) in hot.describe()
    # The banner said "saved as yours to ..." before anything was, then the save failed (a full disk).
    assert f"; what this run learns is saved to {hot.path}" in hot.describe() and "saved as" not in hot.describe()
    # Saving writes the user's own files: the starter's content plus what this session learned.
    hot.matrix[6] = 6
    hot.store.add(conversation(1), 100)
    hot.save()
    mine = read_matrix(hot.path)
    assert mine.matrix[5].tolist() == [1, 2, 3, 4] and mine.matrix[6].tolist() == [6] * K
    assert mine.meta.model_id == "m" and mine.meta.update_count == 2
    assert stored(hot.path) == [conversation(40), conversation(1)]
    assert acceptance_path(hot.path).exists()
    assert snapshot(seeds) == before  # the starter files are only read
    again = open_hot(seeds=seeds)
    assert again.state == "hot" and again.seed is None


def test_starter_files_are_only_for_the_default_path_without_cold(seeds, tmp_path):
    assert open_hot(tmp_path / "mine.safetensors", seeds=seeds).state == "new"
    cold = open_hot(cold=True, seeds=seeds)
    assert cold.state == "cold" and not cold.matrix.any() and cold.store.documents == []
    other = HotMatrix.open(FakeTokenizer(shift=1), VOCAB, "m", k=K, seeds=seeds)  # another file name
    assert other.state == "new"


def test_a_seeded_session_with_no_save_writes_nothing(seeds):
    hot = open_hot(seeds=seeds, save=False)
    hot.matrix[6] = 6
    hot.store.add(conversation(1), 100)
    assert hot.save() == Saved() and not hot.path.parent.exists()
    assert hot.describe().endswith("not saved + store of 20 tokens in 2 conversations")


def test_damaged_starter_files_are_an_error_saying_what_to_do(seeds):
    name = default_path(FP, VOCAB, K).name
    recycled_store_path(seeds / name).write_bytes(b"junk")
    with pytest.raises(StoreFileError, match="the starter files shipped with tr are damaged; reinstall tr") as info:
        open_hot(seeds=seeds)
    assert info.value.remedies == STARTER
    (seeds / name).write_bytes(b"junk")
    with pytest.raises(MatrixFileError, match="the starter files shipped with tr are damaged; reinstall tr") as info:
        open_hot(seeds=seeds)
    assert info.value.remedies == STARTER
    assert_one_line_without_flags(str(info.value))


def test_the_shipped_starter_directory_is_a_package_folder():
    assert seed_dir().is_dir() and (seed_dir() / "__init__.py").is_file()


@pytest.mark.parametrize("content", ["not a matrix", "another model", "another k"])
def test_cold_refuses_at_start_a_file_it_would_write_over(tmp_path, content):
    """--cold --matrix FILE saves into FILE at exit: a user's text file named like a matrix, or
    the matrix of another tokenizer or k, is refused before anything runs and left as it was."""
    path = tmp_path / "notes.safetensors"
    if content == "not a matrix":
        path.write_text("my notes\n")
    elif content == "another model":
        write_matrix(path, MatrixFile.empty(VOCAB, K, "someone-else", "x"))
    else:
        write_matrix(path, MatrixFile.empty(VOCAB, K * 2, FP, "m"))
    before = path.read_bytes()
    with pytest.raises(StoreError) as info:
        open_hot(path, cold=True)
    message = str(info.value)
    assert message.startswith(str(path)) and "a cold start saves into it at exit" in message
    assert info.value.remedies == SAVE_TARGET
    assert_one_line_without_flags(message)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    cold = open_hot(path, cold=True, save=False)  # nothing is saved: nothing to protect
    cold.matrix[3] = 3
    assert cold.save() == Saved() and path.read_bytes() == before


def test_cold_merges_into_this_models_matrix(tmp_path):
    path = tmp_path / "m.safetensors"
    hot = open_hot(path)
    hot.matrix[2] = 2
    hot.save()
    cold = open_hot(path, cold=True)
    assert cold.matrix[2].tolist() == [0] * K  # started empty
    cold.matrix[3] = 3
    assert cold.save().rows == 1
    merged = read_matrix(path).matrix
    assert merged[2].tolist() == [2] * K and merged[3].tolist() == [3] * K


def counted(hot: HotMatrix, steps: int, correct: list[bool]) -> None:
    buffers = TreeBuffers.build(TreeSpec.from_paths("t", [[0], [1]]))
    for _ in range(steps):
        hot.acceptance.record(buffers, torch.tensor(correct))


def test_concurrent_sessions_add_up_their_acceptance_counts(tmp_path):
    """Two processes sharing a matrix each save what they counted; neither overwrites the other
    (the matrix rows already merge; the statistics beside them must too)."""
    path = tmp_path / "m.safetensors"
    first, second = open_hot(path), open_hot(path)
    counted(first, 3, [True, True, False])
    counted(second, 5, [True, False, True])
    first.save()
    second.save()
    assert open_hot(path).acceptance.observed_steps == 8
    counted(first, 2, [True, True, False])  # a later save adds only what was counted since
    first.save()
    merged = open_hot(path).acceptance
    assert merged.observed_steps == 10
    expected = AcceptanceStats(K)
    for stats in (first.acceptance, second.acceptance):
        expected.hits += stats.hits
        expected.trials += stats.trials
    assert torch.equal(merged.hits, expected.hits) and torch.equal(merged.trials, expected.trials)


NOT_FINITE = f'{{"k": {K}, "hits": [[NaN{", 0" * (K - 1)}]], "trials": [[Infinity{", 1" * (K - 1)}]]}}'


@pytest.mark.parametrize("text", [NOT_FINITE, "Infinity", "{not json", "[]"])
def test_unusable_acceptance_statistics_are_a_warning_and_kept_aside(tmp_path, text):
    path = tmp_path / "m.safetensors"
    acceptance_path(path).write_text(text)
    hot = open_hot(path)
    assert hot.acceptance.observed_steps == 0
    assert len(hot.warnings) == 1 and str(acceptance_path(path)) in hot.warnings[0]
    counted(hot, 1, [True, True, False])
    saved = hot.save()
    assert [kept.name.split(".corrupt-")[0] for kept in saved.kept_aside] == [acceptance_path(path).name]
    assert open_hot(path).acceptance.observed_steps == 1 and open_hot(path).warnings == []
