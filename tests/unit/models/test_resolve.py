"""The MODEL argument (tr_cli/models/resolve.py) when it names something on disk that is neither a
file nor a directory: the refusal says what the path is, not that it is missing. Damaged GGUF
files are tests/unit/models/test_gguf_files.py's."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tr_cli.errors import ModelError
from tr_cli.models import resolve_model


def refusal(arg: str) -> str:
    with pytest.raises(ModelError) as caught:
        resolve_model(arg)
    message = str(caught.value)
    assert "\n" not in message and "no such file" not in message
    assert message.startswith(f"model {arg}: ") and "pass a .gguf file" in message
    return message


@pytest.mark.skipif(not Path("/dev/null").is_char_device(), reason="needs /dev/null")
def test_a_character_device_is_named_as_one():
    assert "a character device, not a model file or directory" in refusal("/dev/null")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_named_as_one(tmp_path):
    pipe = tmp_path / "model.gguf"
    os.mkfifo(pipe)
    assert "a named pipe (FIFO), not a model file or directory" in refusal(str(pipe))


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs Unix sockets")
def test_a_socket_is_named_as_one(tmp_path):
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert "a socket, not a model file or directory" in refusal(str(path))


def test_a_missing_path_is_still_called_missing(tmp_path):
    with pytest.raises(ModelError, match="no such file or directory"):
        resolve_model(str(tmp_path / "absent.gguf"))
