"""The command line words a store error's remedies as its flags (real files: a damaged matrix
met by HotMatrix.open, the call cli/setup.py makes)."""

import re

import pytest

from tr_cli.cli.store_errors import FLAG_WORDS, flag_words, in_flag_words
from tr_cli.errors import MatrixFileError, StoreError, StoreFileError
from tr_cli.store.hot_matrix import HotMatrix
from tr_cli.store.matrix_file import MatrixFile, write_matrix
from tr_cli.store.recycled_file import recycled_store_path
from tr_cli.store.remedies import FixableError, Remedy

from fake_tokenizer import VOCAB, FakeTokenizer, K


def open_hot(path, **kwargs) -> HotMatrix:
    return HotMatrix.open(FakeTokenizer(), VOCAB, "m", k=K, path=path, **kwargs)


def test_an_unreadable_matrix_names_the_flags_that_get_past_it(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"junk")
    with pytest.raises(MatrixFileError) as info, flag_words():
        open_hot(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not a valid tr matrix file (")
    assert message.endswith("; move it away, pass another --matrix, or use --cold") and "\n" not in message


def test_a_cold_start_names_no_save(tmp_path):
    path = tmp_path / "m.safetensors"
    recycled_store_path(path).write_bytes(b"junk")
    with pytest.raises(StoreFileError) as info, flag_words():
        open_hot(path, cold=True)
    assert str(info.value).endswith(
        "; a cold start saves into it at exit; move it away, pass another --matrix, or add --no-save"
    )


def test_another_models_matrix(tmp_path):
    path = tmp_path / "m.safetensors"
    write_matrix(path, MatrixFile.empty(VOCAB, K, "someone-else", "x"))
    with pytest.raises(StoreError) as info, flag_words():
        open_hot(path)
    assert str(info.value).endswith("its token ids mean other tokens here; use the model's own matrix or use --cold")


def test_other_errors_pass_unchanged():
    with pytest.raises(StoreError, match="^plain$"), flag_words():
        raise StoreError("plain")


def test_every_flag_wording_names_a_flag_or_command():
    for remedy, words in FLAG_WORDS.items():
        assert re.search(r"--[a-z]|tr matrix", words), remedy
    exc = FixableError("x", tuple(Remedy))
    assert "--" not in str(exc) and "--" in str(in_flag_words(exc))
