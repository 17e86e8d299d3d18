"""The corpus `tr matrix init` reads: text files and prompt files, refused in one line naming the
file and what is wrong, never how the files were given (the command line adds that)."""

import pytest

from tr_cli.errors import UserError
from tr_cli.text.corpus import CorpusError, CorpusText, read_corpus


def test_text_blocks_and_prompts(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The cat sat.\n\nThe dog sat.\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["Say hi.", "Again."]}\n')
    assert read_corpus([notes, prompts]) == [
        CorpusText("The cat sat.", False),
        CorpusText("The dog sat.", False),
        CorpusText("Say hi.", True),
        CorpusText("Again.", True),
    ]
    assert read_corpus([]) and all(text.is_prompt for text in read_corpus([]))  # the bundled sample


@pytest.mark.parametrize("case", ["missing", "directory", "not UTF-8", "no text"])
def test_an_unusable_corpus_names_the_file_and_no_flag(tmp_path, case):
    path = tmp_path / "x.txt"
    if case == "directory":
        path.mkdir()
    elif case == "not UTF-8":
        path.write_bytes(b"\xff\xfe\xfa")
    elif case == "no text":
        path.write_text("\n\n  \n")
    with pytest.raises(CorpusError) as info:
        read_corpus([path])
    exc = info.value
    assert isinstance(exc, UserError) and "--" not in str(exc) and "\n" not in str(exc)
    if case == "no text":
        assert exc.path is None and str(exc) == exc.reason == "the files hold no text"
        return
    assert exc.path == path and str(exc) == f"{path}: {exc.reason}"
    if case == "not UTF-8":
        assert exc.reason.startswith("cannot read it as UTF-8 text (")
    elif case == "directory":
        assert exc.reason == "is a folder; name a text or prompt file"
    else:
        assert exc.reason == "no such file"


def test_a_prompt_files_own_errors_name_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{oops\n')
    with pytest.raises(UserError, match=f"{bad}:2"):
        read_corpus([bad])
