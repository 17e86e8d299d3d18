"""`tr matrix init | inspect | export | import | list` as a user runs them (CliRunner, real files)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tr_cli.cli import app
from tr_cli.store.matrix_file import MatrixFile, is_matrix_name, read_matrix, write_matrix
from tr_cli.store.paths import seed_dir
from tr_cli.store.recycled_file import read_recycled_store, recycled_store_path

runner = CliRunner()


@pytest.fixture(autouse=True)
def plain_output(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


def tr(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def stored(home):
    files = sorted(p for p in (home / "data" / "matrices").glob("*.safetensors") if is_matrix_name(p))
    assert len(files) == 1
    return files[0]


def test_init_inspect_list(home, tiny_llama_dir):
    model = str(tiny_llama_dir)
    out = tr("matrix", "init", model, "--dtype", "float32")
    assert out.exit_code == 0, out.output
    path = stored(home)
    data = read_matrix(path)
    assert data.meta.model_id == model and data.rows_filled > 100
    assert (data.stamps > 0).sum() == data.rows_filled

    again = tr("matrix", "init", model)
    assert again.exit_code == 1 and "a matrix already exists (" in again.output
    assert "; pass --force to overwrite it" in again.output

    report = json.loads(tr("matrix", "inspect", model, "--json", "--token", "Hello").stdout)
    assert report["path"] == str(path.resolve())
    assert report["shape"] == [49152, 8] and report["rows_filled"] == data.rows_filled
    assert report["model"] == model and report["update_count"] == data.rows_filled
    (entry,) = report["tokens"]
    assert entry["token"] == "Hello" and len(entry["candidates"]) == 8
    assert [c["id"] for c in entry["candidates"]] == data.matrix[entry["token_id"]].tolist()

    human = tr("matrix", "inspect", model)
    assert human.exit_code == 0 and "rows filled" in human.stdout and path.name in human.stdout.replace("\n", "")
    listing = tr("matrix", "list")
    assert listing.exit_code == 0 and model in listing.stdout.replace("\n", "")


def test_init_from_files_and_bad_corpus(home, tiny_llama_dir, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("The cat sat on the mat.\n\nThe dog sat on the log.")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["Say hi."]}\n{"prompt": "Count to three."}\n')
    out = tr("matrix", "init", str(tiny_llama_dir), "--from", str(text), "--from", str(prompts))
    assert out.exit_code == 0, out.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{oops\n')
    out = tr("matrix", "init", str(tiny_llama_dir), "--from", str(bad), "--force")
    assert out.exit_code == 1 and f"{bad}:2" in out.output
    # The corpus names the file; the command line says how it was given.
    out = tr("matrix", "init", str(tiny_llama_dir), "--from", str(tmp_path / "gone.txt"))
    assert out.exit_code == 1 and f"--from {tmp_path / 'gone.txt'}: no such file" in out.output
    (tmp_path / "blank.txt").write_text("\n\n")
    out = tr("matrix", "init", str(tiny_llama_dir), "--from", str(tmp_path / "blank.txt"))
    assert out.exit_code == 1 and "--from: the files hold no text" in out.output


def test_init_from_a_file_on_the_packaged_models_default_weights(home, smollm2_checkpoint, tmp_path):
    """The README's first command, on the default weights (int4 on tr's kernels where they run,
    whose layers take batch 1: the texts' chunks went in as one batch and failed with
    'x: (1, tokens, hidden)')."""
    text = tmp_path / "notes.txt"
    text.write_text(  # each text longer than the store's shortest document (8 tokens)
        "The cat sat on the mat and looked out of the window.\n\n"
        "The dog sat on the log and barked at the passing cars.\n\n"
        "A bird sang in the old oak tree at the end of the garden."
    )
    out = tr("matrix", "init", "smollm2", "--from", str(text))
    assert out.exit_code == 0, out.output
    assert "recycled store: 3 texts" in out.output.replace("\n", " ")
    assert read_matrix(stored(home)).rows_filled >= 15


def test_export_import_round_trip_and_refusals(home, tiny_llama_dir, tmp_path):
    model = str(tiny_llama_dir)
    assert tr("matrix", "init", model).exit_code == 0
    path = stored(home)
    original = read_matrix(path)

    exported = tmp_path / "moved.safetensors"
    assert tr("matrix", "export", model, str(exported)).exit_code == 0
    assert exported.read_bytes() == path.read_bytes()
    assert tr("matrix", "export", model, str(exported)).exit_code == 1  # exists, no --force
    # An output nobody can write is one line (it used to be "unexpected FileExistsError/OSError").
    (tmp_path / "a-file").write_text("")
    out = tr("matrix", "export", model, str(tmp_path / "a-file" / "m.safetensors"))
    assert out.exit_code == 1 and "a-file is not a directory; export to an existing directory" in out.output
    out = tr("matrix", "export", model, "/proc/m.safetensors")  # the kernel's: no file can be made there
    assert out.exit_code == 1 and "/proc/m.safetensors: cannot write it (" in out.output
    assert "unexpected" not in out.output and len(out.output.strip().splitlines()) == 1

    # Corrupt, truncated and foreign inputs are refused and leave the store untouched.
    before = path.read_bytes()
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 100)
    (tmp_path / "half.safetensors").write_bytes(exported.read_bytes()[:1000])
    for bad in ("junk", "half"):
        out = tr("matrix", "import", model, str(tmp_path / f"{bad}.safetensors"))
        assert out.exit_code == 1 and "not a valid tr matrix file" in out.output
    foreign = MatrixFile.empty(49152, 8, "0000000000000000", "other-model")
    foreign.matrix[7] = 5
    foreign.stamps[7] = 2**62
    write_matrix(tmp_path / "foreign.safetensors", foreign)
    out = tr("matrix", "import", model, str(tmp_path / "foreign.safetensors"))
    assert out.exit_code == 1 and "another tokenizer" in out.output and "; pass --force to import anyway" in out.output
    small = MatrixFile.empty(1000, 8, original.meta.fingerprint, "small")
    write_matrix(tmp_path / "small.safetensors", small)
    out = tr("matrix", "import", model, str(tmp_path / "small.safetensors"), "--force")
    assert out.exit_code == 1 and "1,000×8" in out.output and out.output.rstrip().endswith("not imported")
    other_k = MatrixFile.empty(49152, 4, original.meta.fingerprint, "k4")
    write_matrix(tmp_path / "k4.safetensors", other_k)
    out = tr("matrix", "import", model, str(tmp_path / "k4.safetensors"))
    assert out.exit_code == 1 and "49,152×4" in out.output and "; not imported; pass its k as --k" in out.output
    assert path.read_bytes() == before

    # --force merges a foreign-fingerprint matrix of the same shape; its newer row wins.
    out = tr("matrix", "import", model, str(tmp_path / "foreign.safetensors"), "--force")
    assert out.exit_code == 0, out.output
    merged = read_matrix(path)
    assert merged.matrix[7].tolist() == [5] * 8
    unchanged = torch.ones(49152, dtype=torch.bool)
    unchanged[7] = False
    assert torch.equal(merged.matrix[unchanged], original.matrix[unchanged])

    # --replace puts the exported copy back bit for bit.
    out = tr("matrix", "import", model, str(exported), "--replace")
    assert out.exit_code == 0, out.output
    replaced = read_matrix(path)
    assert torch.equal(replaced.matrix, original.matrix) and torch.equal(replaced.stamps, original.stamps)


def test_inspect_on_a_fresh_home_shows_the_starter_the_next_run_starts_from(home, tiny_llama_dir):
    # The tiny model speaks through SmolLM2's tokenizer, for which tr ships a starter matrix.
    starter = next(p for p in sorted(seed_dir().glob("*-k8.safetensors")) if is_matrix_name(p))
    shipped = read_matrix(starter)
    model = str(tiny_llama_dir)
    human = tr("matrix", "inspect", model)
    assert human.exit_code == 0, human.output
    assert "tr matrix init" not in human.output
    assert "the next run starts from the starter matrix shipped with tr" in human.output.replace("\n", "")
    assert f"{shipped.meta.update_count:,} row updates" in human.stdout
    report = json.loads(tr("matrix", "inspect", model, "--json").stdout)
    assert report["starter"] is True and report["path"] == str(starter.resolve())
    assert report["update_count"] == shipped.meta.update_count and report["rows_filled"] == shipped.rows_filled
    assert report["store"]["documents"] == len(read_recycled_store(recycled_store_path(starter)).documents) > 0
    assert not (home / "data").exists()  # only read: the next run saves the user's own copy


def test_inspect_file_and_missing_matrix(home, tiny_llama_dir, tmp_path):
    out = tr("matrix", "inspect", str(tiny_llama_dir), "--k", "4")  # no starter matrix with k 4
    assert out.exit_code == 1 and "no stored matrix" in out.output
    assert f"tr matrix init {tiny_llama_dir} --k 4" in out.output.replace("\n", "")
    f = tmp_path / "m.safetensors"
    write_matrix(f, MatrixFile.empty(49152, 8, "x", "y"))
    report = json.loads(tr("matrix", "inspect", str(f), "--json").stdout)
    assert report["rows_filled"] == 0 and report["model"] == "y"
    out = tr("matrix", "inspect", str(f), "--token", "hi")
    assert out.exit_code == 1 and "--model" in out.output
    out = tr("matrix", "inspect", str(f), "--token", "hi", "--model", str(tiny_llama_dir))
    assert out.exit_code == 1 and "matrix belongs to another tokenizer (fingerprint x, model y)" in out.output
    assert "; pass the model it was built for as --model" in out.output


def _read_only_mounts() -> bool:
    """Whether this machine lets an unprivileged user namespace bind-mount a folder read-only (the
    one way to make a read-only home that root cannot write to)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _read_only_mounts(), reason="needs unshare -rm for a read-only bind mount")
def test_import_into_a_read_only_home_is_one_line_and_changes_nothing(home, tiny_llama_dir, tmp_path):
    model = str(tiny_llama_dir)
    assert tr("matrix", "init", model).exit_code == 0
    path = stored(home)
    exported = tmp_path / "moved.safetensors"
    assert tr("matrix", "export", model, str(exported)).exit_code == 0
    before = sorted((p.name, p.read_bytes()) for p in path.parent.iterdir())
    env = {**os.environ, "TR_HOME": str(home), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "200"}
    command = f'mount --bind -o ro "{home}" "{home}" && exec "$0" matrix import "$1" "$2"'
    out = subprocess.run(
        ["unshare", "-rm", "sh", "-c", command, str(Path(sys.executable).parent / "tr"), model, str(exported)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert "cannot make its lock file" in lines[0] and "Read-only file system" in lines[0], lines[0]
    assert sorted((p.name, p.read_bytes()) for p in path.parent.iterdir()) == before
