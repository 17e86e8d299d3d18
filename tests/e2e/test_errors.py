"""Every family of tr's errors reaches the user as one line on stderr and exit status 1, never as
a traceback: bad options (UserError), an unusable model argument (ModelError), a stored file tr
cannot use (StoreError), an invalid tree (the core's InvalidTree), a model whose attention the
decoder cannot mask (the core's UnsupportedAttention), a chat turn that cannot run (CommandError)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def tr(*args: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "200", "TR_HOME": str(home)}
    return subprocess.run([str(BIN / "tr"), *args], capture_output=True, text=True, env=env, input=stdin, timeout=600)


def assert_one_line(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("tr: error: "), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert sum(line.startswith("tr: error:") for line in lines) == 1
    for word in words:
        assert word in lines[-1], lines[-1]


@pytest.fixture(scope="module")
def chunked_attention_dir(tmp_path_factory, tiny_llama_dir) -> Path:
    """The tiny Llama with chunked attention switched on in its config (as Llama 4 has)."""
    directory = tmp_path_factory.mktemp("chunked")
    for source in tiny_llama_dir.iterdir():
        (directory / source.name).write_bytes(source.read_bytes())
    config = json.loads((directory / "config.json").read_text())
    config["attention_chunk_size"] = 8
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_user_error(home):
    out = tr("generate", "--tree", "bushy", home=home)
    assert_one_line(out, "--tree bushy: unknown tree")
    assert out.stderr.strip().count("\n") == 0  # nothing loaded, nothing else said


def test_model_error(home, tmp_path):
    out = tr("generate", str(tmp_path / "missing.gguf"), "-p", "hi", home=home)
    assert_one_line(out, "model ", "no such file")


@pytest.mark.parametrize(("flag", "value"), [("--temperature", "nan"), ("--top-p", "inf")])
def test_a_non_finite_sampling_flag_is_named_as_such(home, flag, value):
    out = tr("generate", flag, value, "-p", "hi", home=home)
    assert_one_line(out, f"{flag} {value}: not a finite number")


def test_a_model_path_that_is_a_device_says_what_it_is(home):
    out = tr("generate", "/dev/null", "-p", "hi", home=home)
    assert_one_line(out, "model /dev/null: a character device, not a model file or directory", ".gguf")
    assert "no such file" not in out.stderr


def test_store_error(home, tiny_llama_dir, tmp_path):
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"not a matrix at all")
    out = tr("generate", str(tiny_llama_dir), "--matrix", str(corrupt), "-p", "hi", "-n", "4", home=home)
    assert_one_line(out, str(corrupt), "not a valid tr matrix file", "--cold")
    assert corrupt.read_bytes() == b"not a matrix at all"  # refused, never replaced


def test_invalid_tree_from_the_core(home, tmp_path):
    spec = tmp_path / "tree.json"
    spec.write_text(json.dumps({"paths": [[0], [0, 0, 0]]}))  # [0, 0] is missing
    out = tr("generate", "--tree", str(spec), home=home)
    assert_one_line(out, "--tree", "not a tree spec", "has no parent path")


def test_unsupported_attention_from_the_core(home, chunked_attention_dir):
    out = tr("generate", str(chunked_attention_dir), "--dtype", "float32", "-p", "hi", "-n", "4", home=home)
    assert_one_line(out, "chunked_attention", "not supported")


def test_chat_command_error_in_piped_mode(home, tmp_path, tiny_llama_dir):
    rejecting = tmp_path / "rejecting"
    rejecting.mkdir()
    for source in tiny_llama_dir.iterdir():
        (rejecting / source.name).write_bytes(source.read_bytes())
    (rejecting / "chat_template.jinja").write_text("{{ raise_exception('this template takes no messages') }}")
    out = tr("chat", str(rejecting), "--dtype", "float32", "-n", "4", home=home, stdin="Hello\n")
    assert_one_line(out, "the chat template rejects this conversation", "takes no messages")


def three_token_gguf(path: Path) -> Path:
    """A one-layer Llama GGUF whose vocabulary is "a", "b" and "ab": fewer tokens than the 8
    candidates a matrix row keeps by default."""
    import gguf
    import numpy as np

    hidden, ffn, heads = 16, 32, 2
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("three")
    for add, value in [
        (writer.add_context_length, 64),
        (writer.add_embedding_length, hidden),
        (writer.add_block_count, 1),
        (writer.add_feed_forward_length, ffn),
        (writer.add_head_count, heads),
        (writer.add_head_count_kv, heads),
        (writer.add_rope_dimension_count, hidden // heads),
    ]:
        add(value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.add_token_types([1, 1, 3])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(2)
    shapes = {"token_embd": (3, hidden), "attn_q": (hidden, hidden), "attn_k": (hidden, hidden)}
    shapes |= {"attn_v": (hidden, hidden), "attn_output": (hidden, hidden), "ffn_gate": (ffn, hidden)}
    shapes |= {"ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    for name, shape in shapes.items():
        full = name if name == "token_embd" else f"blk.0.{name}"
        writer.add_tensor(f"{full}.weight", (rng.standard_normal(shape) * 0.02).astype(np.float32))
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        writer.add_tensor(f"{name}.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def three_tokens(tmp_path_factory) -> str:
    return str(three_token_gguf(tmp_path_factory.mktemp("three") / "three.gguf"))


@pytest.mark.parametrize("command", [["generate", "MODEL", "-p", "ab", "-n", "2"], ["matrix", "init", "MODEL"]])
def test_a_vocabulary_smaller_than_k_names_k(home, three_tokens, command):
    """It was `unexpected RuntimeError: selected index k out of range` from torch.topk."""
    from typer.testing import CliRunner

    from tr_cli.cli import app

    out = CliRunner().invoke(app, [three_tokens if word == "MODEL" else word for word in command])
    assert out.exit_code == 1, out.output
    last = out.output.strip().splitlines()[-1]
    assert last == "tr: error: --k 8: more candidates per matrix row than the model has tokens (3); pass --k 3 or less"


def test_a_checkpoint_directory_without_a_tokenizer_says_so(home, tmp_path, tiny_llama_dir):
    """A directory holding only config.json was "Couldn't instantiate the backend tokenizer from one of: )"."""
    from typer.testing import CliRunner

    from tr_cli.cli import app

    (tmp_path / "config.json").write_bytes((tiny_llama_dir / "config.json").read_bytes())
    for args in (["generate", str(tmp_path), "-p", "hi"], ["matrix", "inspect", str(tmp_path)]):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 1, out.output
        assert out.output.strip().splitlines()[-1] == (
            f"tr: error: model {tmp_path}: the directory has no tokenizer (none of tokenizer.json, "
            "tokenizer_config.json, tokenizer.model, vocab.json, vocab.txt); save the model's tokenizer beside "
            "its config.json, or pass the model's .gguf"
        )
