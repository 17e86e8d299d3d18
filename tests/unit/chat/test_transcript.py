"""/load's reader (tr_cli/chat/transcript.py): a device or a file that is not a conversation is one
line, after a bounded read (`/load /dev/zero` grew tr chat to 9.6 GB, deaf to Ctrl-C)."""

import pytest

from tr_cli.chat.errors import CommandError
from tr_cli.chat.transcript import read_transcript, write_transcript


@pytest.mark.parametrize(
    "path, words",
    [
        ("/dev/zero", "cannot read /dev/zero: more than the 64 MB tr reads from one file"),
        ("/dev/urandom", "cannot read /dev/urandom: cannot read it as UTF-8 text"),
        ("/nonexistent/file.json", "cannot read /nonexistent/file.json: no such file"),
    ],
)
def test_an_unreadable_conversation_is_one_line(path, words):
    with pytest.raises(CommandError) as caught:
        read_transcript(path)
    assert str(caught.value).startswith(words) and "\n" not in str(caught.value)


def test_a_saved_conversation_reads_back_and_a_deep_one_is_refused(tmp_path):
    saved = write_transcript(tmp_path / "c.json", "be brief", [{"role": "user", "content": "hi"}], "m")
    assert read_transcript(saved) == ("be brief", [{"role": "user", "content": "hi"}])
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CommandError, match="not a saved conversation"):
        read_transcript(deep)
