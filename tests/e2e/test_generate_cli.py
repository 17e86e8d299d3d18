"""The command line as a user meets it: version, one-line errors (exit 1, no traceback), and
`tr generate` on the packaged model, a checkpoint directory and a cached Hugging Face id."""

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

BIN = Path(sys.executable).parent


def run(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [str(BIN / "tr"), *args], capture_output=True, text=True, env=full_env, input=stdin, timeout=600
    )


@pytest.mark.parametrize(
    "command", [[str(BIN / "tr")], [str(BIN / "token-recycling")], [sys.executable, "-m", "tr_cli"]]
)
def test_version(command):
    import torch
    import transformers

    from tr_cli import __version__
    from tr_cli.models.cpu import cpu_isa

    out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    first, stack, cpu = out.stdout.splitlines()
    assert first == f"tr {__version__}"
    assert stack.startswith(f"torch {torch.__version__} · transformers {transformers.__version__} · Python 3.")
    assert cpu.startswith("CPU: ") and cpu.endswith(f"({cpu_isa()})")


def gguf_header(path: Path, architecture: str) -> Path:
    key = b"general.architecture"
    value = architecture.encode()
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    data += struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
    path.write_bytes(data)
    return path


def bad_inputs(tmp: Path) -> dict[str, tuple[str, str]]:
    (tmp / "empty-dir").mkdir()
    (tmp / "notes.txt").write_text("hello")
    (tmp / "garbage.gguf").write_bytes(os.urandom(64))
    (tmp / "truncated.gguf").write_bytes(b"GGUF\x03\x00")
    gguf_header(tmp / "alien.gguf", "fooarch")
    return {
        "missing file": (str(tmp / "nope.gguf"), "no such file"),
        "unknown hub id": ("someone/not-a-cached-model", "not found in the local Hugging Face cache"),
        "directory without config": (str(tmp / "empty-dir"), "no config.json"),
        "not a gguf file": (str(tmp / "notes.txt"), "not .gguf"),
        "corrupt gguf": (str(tmp / "garbage.gguf"), "not a GGUF file"),
        "truncated gguf": (str(tmp / "truncated.gguf"), "truncated"),
        "unsupported gguf architecture": (str(tmp / "alien.gguf"), "architecture 'fooarch' is not supported"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing file",
        "unknown hub id",
        "directory without config",
        "not a gguf file",
        "corrupt gguf",
        "truncated gguf",
        "unsupported gguf architecture",
    ],
)
def test_bad_model_argument_is_one_line_error(tmp_path, case):
    arg, expected = bad_inputs(tmp_path)[case]
    out = run("generate", arg, "-p", "hi")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("tr: error: model ")
    assert arg in lines[0] and expected in lines[0]
    assert "Traceback" not in out.stderr + out.stdout


def test_bad_options_are_one_line_errors(tmp_path):
    bad_tree = tmp_path / "tree.json"
    bad_tree.write_text("{not json")
    nested = tmp_path / "nested.json"
    nested.write_text('{"paths": ' + "[" * 100_000 + "]" * 100_000 + "}")
    bushy = tmp_path / "bushy.json"
    bushy.write_text(
        json.dumps(
            {
                "paths": [[a] for a in range(8)]
                + [[a, b] for a in range(8) for b in range(8)]
                + [[a, b, c] for a in range(8) for b in range(8) for c in range(8)]
            }
        )
    )
    deep = tmp_path / "deep.json"
    deep.write_text(json.dumps({"paths": [[0] * d for d in range(1, 101)]}))
    negative = tmp_path / "negative.json"
    negative.write_text(json.dumps({"paths": [[0], [-1]]}))
    for args, expected in [
        (["--tree", "bushy"], "unknown tree"),
        (["--tree", str(bad_tree)], "not a tree spec"),
        (["--tree", str(nested)], "nested too deeply"),
        (["--tree", str(deep)], "100 nodes, 100 deep; a tree may have at most 512 nodes and 64 levels"),
        (["--tree", str(bushy), "--k", "8"], "584 nodes, 3 deep"),
        (["--tree", str(negative)], "negative"),
        (["--k", "100000"], "--k 100000: at most 64"),
        (["--lookup", "100000"], "--lookup 100000: at most 64"),
        ([""], "MODEL is empty"),
        (["--tree", "paper", "--k", "4"], "uses candidate slot 7"),
        (["--dtype", "float8"], "unknown dtype"),
        (["--weights", "int3"], "--weights int3: unknown; use auto, dense, int8, int4"),
        (["--weights", "int8", "--dtype", "float16"], "--weights int8: computes in float32 (tr's kernels) or bfloat16"),
        (["--device", "tpu"], "unknown device"),
        (["--temperature", "-1"], "--temperature -1.0: must be 0 (greedy) or more"),
        (["--top-p", "2"], "--top-p 2.0: must be between 0 and 1"),
    ]:
        out = run("generate", "-p", "hi", *args)
        assert out.returncode == 1, args
        assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_generate_packaged_model_is_identical_to_generate(smollm2_checkpoint):
    """The default run (its int4 weights on tr's kernels where they run) against transformers'
    greedy generate on the same weights."""
    out = run("generate", "-n", "24", "--compare", "-p", "Which ocean lies between Europe and America?")
    assert out.returncode == 0, out.stderr
    assert "Atlantic" in out.stdout
    assert "output identical" in out.stderr
    assert "MAT" in out.stderr and "tok/s" in out.stderr


def test_generate_from_checkpoint_directory(tiny_llama_dir):
    out = run("generate", str(tiny_llama_dir), "--dtype", "float32", "-n", "12", "--compare", "-p", "Hello")
    assert out.returncode == 0, out.stderr
    assert "12 tokens" in out.stderr and "output identical" in out.stderr


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_generate_with_quantized_weights(tiny_llama_dir, home, weights, request):
    """--weights: the banner says what runs (tr's kernels in float32 where they can run, built once
    per run by the fixture); --compare runs generate on the same quantized model. TR_DEBUG=1 says
    where the start's time went, step by step."""
    from tr_cli.models import native_kernels

    why_not = native_kernels.unavailable()
    if why_not is None:
        request.getfixturevalue("tr_kernels")
    args = ("generate", str(tiny_llama_dir), "--weights", weights, "-n", "12", "--compare", "-p", "Hello")
    out = run(*args, env={"TR_DEBUG": "1"})
    assert out.returncode == 0, out.stderr
    kernels = "float32 on tr's kernels" if why_not is None else "bfloat16 on torch's kernels"
    assert f"{weights} weights, {kernels}" in out.stderr
    seconds = r"\d+\.\d\d s"
    assert re.search(
        rf"start: before loading \(Python, imports, checks\) {seconds} · loading the model {seconds} · "
        rf"Loading .*{seconds} · "
        rf"(Quantizing .*'s weights to {weights} \(kept for later starts\)|"
        rf"Reading .*'s {weights} weights, quantized at an earlier start) {seconds} · "
        rf"opening the matrix and the recycled store {seconds} · "
        rf"building the decoder \(t\(N\) read or measured\) {seconds}",
        out.stderr,
    ), out.stderr
    assert re.search(r"transformers greedy: 12 tokens.*(output identical|output differs from token)", out.stderr)


def test_a_kernel_build_that_fails_falls_back_to_torch_kernels(tiny_llama_dir, tmp_path, gguf_cache):
    """A machine whose compiler cannot build tr's kernels still runs the quantized model, on
    torch's kernels in bfloat16, and says so once."""
    from conftest import new_home

    home = tmp_path / "fresh"
    new_home(home, gguf_cache)
    (home / "cache" / "kernels").unlink()  # not the run's built kernels: this home builds its own
    args = ("generate", str(tiny_llama_dir), "--weights", "int4", "-n", "4", "-p", "Hello")
    out = run(*args, env={"TR_HOME": str(home), "CXX": "false"})
    assert out.returncode == 0, out.stderr
    assert "building tr's kernels with" in out.stderr and "running torch's kernels in bfloat16" in out.stderr
    assert "int4 weights, bfloat16 on torch's kernels: building tr's kernels with" in out.stderr
    assert list((home / "cache" / "kernels").glob("*/build.log"))


def test_sampled_generate_is_reproducible_from_its_seed(tiny_llama_dir):
    """Same seed, same tokens, although the first run saved a hotter matrix for the second;
    --compare samples transformers' side too and compares no tokens."""
    args = (
        "generate",
        str(tiny_llama_dir),
        "--dtype",
        "float32",
        "-n",
        "12",
        "-p",
        "Hello",
        "--temperature",
        "0.8",
        "--seed",
        "3",
    )
    first = run(*args)
    second = run(*args, "--compare")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout and first.stdout.strip()
    assert "sampling: temperature 0.8, top_p 1, top_k 50, seed 3" in first.stderr
    assert "transformers sampling:" in second.stderr and "outputs differ by chance" in second.stderr


def test_generate_from_cached_hub_id(tmp_path, tiny_llama_dir):
    hub = tmp_path / "hub"
    snapshot = hub / "models--tiny-org--tiny-llama" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_llama_dir, snapshot)
    (hub / "models--tiny-org--tiny-llama" / "refs").mkdir()
    (hub / "models--tiny-org--tiny-llama" / "refs" / "main").write_text("0123abcd")
    out = run(
        "generate", "tiny-org/tiny-llama", "--dtype", "float32", "-n", "6", "-p", "Hi", env={"HF_HUB_CACHE": str(hub)}
    )
    assert out.returncode == 0, out.stderr
    assert "6 tokens" in out.stderr


def test_prompt_from_stdin(smollm2_checkpoint):
    out = run("generate", "--dtype", "float32", "-n", "8", "-p", "-", stdin="Say hello.")
    assert out.returncode == 0, out.stderr
    assert "Say hello." in out.stderr and out.stdout.strip()


def test_the_model_as_an_option(smollm2_checkpoint):
    """-m/--model, as other tools take it (it was "No such option: -m")."""
    out = run("generate", "-m", "smollm2", "--dtype", "float32", "-n", "4", "-p", "hi")
    assert out.returncode == 0, out.stderr
    assert "smollm2" in out.stderr.splitlines()[0] and out.stdout.strip()


def test_error_text_is_not_read_as_markup():
    from typer.testing import CliRunner

    from tr_cli.cli import app

    out = CliRunner().invoke(
        app, ["generate", "/nope/[bold]x[/bold].gguf", "-p", "hi"], env={"NO_COLOR": "1", "COLUMNS": "200"}
    )
    assert out.exit_code == 1
    assert "model /nope/[bold]x[/bold].gguf: no such file" in out.output


@pytest.mark.parametrize("max_new", [5, 16])
def test_printed_reply_keeps_a_character_cut_by_the_token_budget(smollm2_fp32, smollm2_checkpoint, max_new):
    """The issue-15 case: emoji cut by the budget used to vanish (the whole reply waited for a
    character that never completed). What is printed is the decoding of every new token."""
    import torch

    from tr_cli.text.conversation import encode_prompt

    prompt = "Reply with three emoji: 🔥🚀🌊"
    # --tree paper: what is printed does not depend on the tree; a designed one measures t(N) first.
    out = run(
        "generate", str(smollm2_checkpoint), "--dtype", "float32", "--tree", "paper", "-n", str(max_new), "-p", prompt
    )
    assert out.returncode == 0, out.stderr
    ids = encode_prompt(smollm2_fp32.tokenizer, prompt)
    with torch.no_grad():
        generated = smollm2_fp32.model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False)
    tokens = generated[0, len(ids) :].tolist()
    expected = smollm2_fp32.tokenizer.decode(tokens, skip_special_tokens=True)
    assert any(ord(c) > 0x2000 for c in expected), "the reply has no emoji: the case is not exercised"
    assert out.stdout == expected + "\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_save_what_was_learned(sig, tiny_llama_dir, home):
    """SIGTERM/SIGHUP mid-generation used to kill tr at once (exit -15/-1) and lose the run's
    learning; now they leave like Ctrl-C: the matrix is saved, exit status 128 + the signal."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TR_HOME": str(home)}
    args = [str(BIN / "tr"), "generate", str(tiny_llama_dir), "--dtype", "float32", "--tree", "paper"]
    process = subprocess.Popen(
        [*args, "-n", "1800", "-p", "Tell a long story."], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        assert process.stdout.read(16), "no output before the signal"
        process.send_signal(sig)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    err = err.decode()
    assert process.returncode == 128 + sig, err
    assert "terminated" in err and "Traceback" not in err
    saved = re.search(r"matrix: [\d,]+ rows saved to (\S+)", err)
    assert saved, err
    assert load_file(saved.group(1))  # a whole, valid file


def test_a_prompt_past_the_context_is_refused_before_any_forward_and_the_budget_clamped(
    tiny_llama_dir, small_context_model, home
):
    """The tiny Llama holds 2,048 positions: a longer prompt is one line at once (it used to run
    and print garbage); a budget past what is left is clamped with a notice (on a copy holding 128
    positions, so that the clamped reply is short)."""
    options = ["--dtype", "float32", "--tree", "paper", "--no-save"]
    out = run("generate", str(tiny_llama_dir), *options, "-p", "river " * 3000, env={"TR_HOME": str(home)})
    assert out.returncode == 1, out.stderr
    assert "the model's context holds 2,048" in out.stderr and "Traceback" not in out.stderr
    assert not out.stdout.strip()
    out = run(
        "generate", str(small_context_model(128)), *options, "-n", "5000", "-p", "Hello", env={"TR_HOME": str(home)}
    )
    assert out.returncode == 0, out.stderr
    assert "--max-new-tokens 5000 clamped to" in out.stderr


def prompt_tokens(model_dir: Path, prompt: str) -> int:
    """The prompt's length as tr feeds it to the model (chat template included)."""
    from transformers import AutoTokenizer

    from tr_cli.text.conversation import encode_prompt

    return len(encode_prompt(AutoTokenizer.from_pretrained(model_dir), prompt))


def test_a_prompt_past_the_context_is_refused_before_the_weights_load(tiny_llama_dir, home):
    """The designed tree on a fresh home loads the weights and measures t(N) first (minutes for a
    real model): a prompt the context cannot hold used to be refused only after both. Now the
    tokenizer and config alone refuse it: no loading line, no calibration written."""
    prompt = "river " * 3000
    tokens = prompt_tokens(tiny_llama_dir, prompt)
    out = run("generate", str(tiny_llama_dir), "--dtype", "float32", "-p", prompt, env={"TR_HOME": str(home)})
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"tr: error: the prompt has {tokens:,} tokens; the model's context holds 2,048: shorten the prompt"
    ]
    assert not (home / "data" / "calibration").exists()


def test_a_prompt_the_drafts_push_past_the_context_is_refused_after_loading(tiny_llama_dir, small_context_model, home):
    """A prompt that fits with one reply token but not with the drafts' positions passes the
    check before loading; the decoder's depth, known once it is built, refuses it."""
    prompt = "Hello there"
    tokens = prompt_tokens(tiny_llama_dir, prompt)
    model = small_context_model(tokens + 1)
    out = run("generate", str(model), "--dtype", "float32", "--tree", "paper", "-p", prompt, env={"TR_HOME": str(home)})
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"tr: error: the prompt has {tokens} tokens; the model's context holds {tokens + 1} "
        r"\(\d+ more are needed for drafts\): shorten the prompt",
        last,
    ), out.stderr
    assert "Loading " in out.stderr and not out.stdout


@pytest.mark.parametrize("where", ["argv", "stdin"])
def test_a_prompt_that_is_not_utf8_is_one_line_before_the_model_loads(where, home):
    """Bytes that are not UTF-8 (in argv or on stdin) reached the tokenizer as lone surrogates and
    ended in its TypeError."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TR_HOME": str(home)}
    args = [str(BIN / "tr"), "generate", "-n", "4"]
    if where == "argv":
        out = subprocess.run([*args, "-p", b"caf\xe9 \xff"], capture_output=True, env=env, timeout=600)
    else:
        out = subprocess.run([*args, "-p", "-"], input=b"caf\xe9 \xff", capture_output=True, env=env, timeout=600)
    err = out.stderr.decode(errors="replace")
    assert out.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines() == [
        f"tr: error: --prompt{' -' if where == 'stdin' else ''}: byte 0xe9 at character 4 is not valid UTF-8; "
        "give UTF-8 text"
    ]


def test_a_closed_stdin_is_one_line(home):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TR_HOME": str(home)}
    out = subprocess.run(
        f"exec {BIN / 'tr'} generate -p - <&-", shell=True, capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "tr: error: --prompt -: standard input is closed; pipe the text in"
    ]


def test_tr_home_that_is_a_file_is_one_line(home, tmp_path):
    (tmp_path / "file").write_text("")
    out = run("generate", "-p", "hi", env={"TR_HOME": str(tmp_path / "file")})
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"tr: error: TR_HOME={tmp_path / 'file'} is not a directory; "
        "point TR_HOME at a directory (it is created if missing)"
    ]


def test_stdout_that_fails_still_saves_what_was_learned(tiny_llama_dir, home):
    """A full device as stdout (/dev/full) is one line and exit 1; a reader that leaves early
    (`| head -c 1`) is quiet, as with any tool, and exits 128 + SIGPIPE. Both used to skip the save
    (the reply's last write raised first) and print the error as "unexpected"."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "TR_HOME": str(home)}
    args = [str(BIN / "tr"), "generate", str(tiny_llama_dir), "--dtype", "float32", "--tree", "paper", "-p", "Hello"]
    with open("/dev/full", "w") as full:
        out = subprocess.run([*args, "-n", "8"], stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "tr: error: cannot write to standard output (No space left on device)"
    assert re.search(r"matrix: [\d,]+ rows saved to", out.stderr) and "Exception ignored" not in out.stderr
    process = subprocess.Popen([*args, "-n", "1500"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert process.stdout.read(1)
        process.stdout.close()  # the reader leaves
        _, err = process.communicate(timeout=300)
    finally:
        process.kill()
    err = err.decode()
    assert process.returncode == 128 + signal.SIGPIPE, err
    assert "tr: error" not in err and "Traceback" not in err and "Exception ignored" not in err
    saved = re.search(r"matrix: [\d,]+ rows saved to (\S+)", err)
    assert saved, err
    assert load_file(saved.group(1))


CHOICES = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "n", "color"],
    "additionalProperties": False,
}


def test_a_reply_under_a_schema_is_its_json_and_equals_constrained_generate(tiny_llama_dir, home, tmp_path):
    """A random-weight model still writes an instance: the grammar decides what it may say, and
    --compare runs `generate` with the same grammar as a logits processor."""
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(CHOICES))
    out = run("generate", str(tiny_llama_dir), "--schema", str(path), "-n", "40", "--compare", "-p", "Hello")
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert set(reply) == {"ok", "n", "color"} and isinstance(reply["ok"], bool)
    assert reply["n"] in range(10) and reply["color"] in ("red", "green", "blue")
    assert "finish: eos" in out.stderr and "output identical" in out.stderr, out.stderr
    assert "before its JSON was complete" not in out.stderr


def test_a_json_reply_cut_by_the_token_budget_is_said(tiny_llama_dir, home):
    out = run("generate", str(tiny_llama_dir), "--json", "-n", "6", "-p", "Hello")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("{")
    assert "tr: warning: the reply stopped (length) before its JSON was complete; raise --max-new-tokens" in out.stderr


def test_a_json_reply_cut_by_a_stop_string_names_the_stop_string(tiny_llama_dir, home):
    """Every JSON object opens with a brace: a --stop on it ends the reply at once, and more tokens
    would not have helped, so the warning says what did."""
    out = run("generate", str(tiny_llama_dir), "--json", "--stop", "{", "-n", "20", "-p", "Hello")
    assert out.returncode == 0, out.stderr
    assert "finish: stop_string" in out.stderr, out.stderr
    assert "before its JSON was complete: a --stop string came first" in out.stderr
    assert "--max-new-tokens" not in out.stderr


def test_smollm2_extracts_fields_under_a_schema(smollm2_checkpoint, home):
    """The packaged model, default weights, the schema given inline: the fields come out of the text."""
    schema = {
        "type": "object",
        "properties": {
            "full_name": {"type": "string", "maxLength": 40},
            "years_experience": {"type": "integer", "minimum": 0, "maximum": 50},
            "willing_to_relocate": {"type": "boolean"},
        },
        "required": ["full_name", "years_experience", "willing_to_relocate"],
        "additionalProperties": False,
    }
    prompt = (
        "Extract the following fields from the text as JSON: full_name, years_experience, willing_to_relocate.\n\n"
        "Dear Hiring Team, my name is Priya Raman and I am applying for the Senior Data Analyst position. "
        "I have spent seven years building forecasting models. I am happy to relocate to your Columbus office."
    )
    out = run("generate", "--schema", json.dumps(schema), "-n", "60", "--compare", "-p", prompt)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["full_name"] == "Priya Raman" and isinstance(reply["willing_to_relocate"], bool)
    assert "output identical" in out.stderr, out.stderr


def test_a_bad_schema_is_one_line_before_the_model_loads(home, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}))
    out = run("generate", "--schema", str(path), "-p", "hi")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f'tr: error: {path}: Unimplemented keys: ["uniqueItems"]; fix the schema'
    ]
