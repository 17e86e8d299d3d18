"""The recycled store through the command line (CliRunner, real files, the tiny Llama): `tr matrix
init --from` feeds it, `inspect` reports it, `export` / `import` carry it, `list` shows its size,
and `tr generate` adds its conversation to it, except under --no-save; --cold starts empty."""

import json

import pytest
from typer.testing import CliRunner

from tr_cli.cli import app
from tr_cli.models import load_tokenizer
from tr_cli.store.matrix_file import is_matrix_name
from tr_cli.store.paths import cache_dir
from tr_cli.store.recycled_file import (
    RecycledStoreFile,
    RecycledStoreMeta,
    read_recycled_store,
    recycled_store_path,
    write_recycled_store,
)
from tr_cli.text.corpus import read_corpus, token_lists

runner = CliRunner()

PARAGRAPHS = [
    "The cat sat on the mat, and the dog sat on the log beside the old barn door.",
    "A recycled store remembers whole passages: prompts that come back, answers given before.",
]


@pytest.fixture(autouse=True)
def plain_output(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


def tr(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def matrix_file(home):
    (path,) = [p for p in (home / "data" / "matrices").glob("*.safetensors") if is_matrix_name(p)]
    return path


def documents(path) -> list[list[int]]:
    return [doc.tokens.tolist() for doc in read_recycled_store(path).documents]


@pytest.fixture()
def corpus(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("\n\n".join(PARAGRAPHS))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["Explain what a KV cache holds, in two sentences."]}\n{"prompt": "Hi"}\n')
    return [text, prompts]


def test_init_feeds_the_store_and_inspect_reports_it(home, tiny_llama_dir, corpus):
    model = str(tiny_llama_dir)
    out = tr("matrix", "init", model, "--from", str(corpus[0]), "--from", str(corpus[1]))
    assert out.exit_code == 0, out.output
    path = matrix_file(home)
    store = recycled_store_path(path)
    tokenizer, _, _ = load_tokenizer(model, cache=cache_dir())
    expected = token_lists(tokenizer, read_corpus(corpus))
    # One document per text block and prompt (in its chat template), in corpus order.
    assert documents(store) == expected and len(expected) == 4
    assert "store: 4 texts" in out.output

    report = json.loads(tr("matrix", "inspect", model, "--json").stdout)
    assert report["store"]["path"] == str(store.resolve())
    assert report["store"]["documents"] == 4 and report["store"]["tokens"] == sum(map(len, documents(store)))
    assert report["store"]["bytes"] == store.stat().st_size
    assert report["store"]["oldest"] <= report["store"]["newest"]
    human = tr("matrix", "inspect", model).stdout
    assert "store" in human and "4 conversations" in human
    out = tr("matrix", "inspect", str(store))
    assert out.exit_code == 1 and "a recycled store" in out.output and path.name in out.output
    assert "MB" in tr("matrix", "list").stdout.split(path.name)[1]

    # A store without its matrix is not silently replaced either.
    path.unlink()
    out = tr("matrix", "init", model, "--from", str(corpus[0]))
    assert out.exit_code == 1 and "recycled store already exists; pass --force to overwrite it" in out.output
    assert tr("matrix", "init", model, "--from", str(corpus[0]), "--force").exit_code == 0
    assert len(documents(store)) == 2  # rebuilt from this corpus alone

    store.write_bytes(b"junk")
    report = json.loads(tr("matrix", "inspect", model, "--json").stdout)
    assert "not a valid tr recycled store file" in report["store"]["error"]


def test_export_and_import_carry_the_store(home, tiny_llama_dir, corpus, tmp_path, monkeypatch):
    model = str(tiny_llama_dir)
    assert tr("matrix", "init", model, "--from", str(corpus[0])).exit_code == 0
    store = recycled_store_path(matrix_file(home))
    exported = tmp_path / "moved.safetensors"
    out = tr("matrix", "export", model, str(exported))
    assert out.exit_code == 0, out.output
    assert (tmp_path / "moved.store.safetensors").read_bytes() == store.read_bytes()
    out = tr("matrix", "export", model, str(tmp_path / "moved.safetensors"))
    assert out.exit_code == 1 and "--force" in out.output

    # Into another home: stored as it is.
    other = tmp_path / "other-home"
    (other / "cache").mkdir(parents=True)
    (other / "cache" / "gguf").symlink_to(home / "cache" / "gguf", target_is_directory=True)
    monkeypatch.setenv("TR_HOME", str(other))
    out = tr("matrix", "import", model, str(exported))
    assert out.exit_code == 0, out.output
    mine = recycled_store_path(matrix_file(other))
    assert documents(mine) == documents(store)

    # Merged by default: the local conversations stay, the imported ones already held are not doubled.
    local = read_recycled_store(mine)
    extra = read_recycled_store(mine).documents[0]
    newer = type(extra)(extra.tokens.flip(0), extra.stamp + 10**9)
    write_recycled_store(mine, RecycledStoreFile(local.meta, [*local.documents, newer]))
    out = tr("matrix", "import", model, str(exported))
    assert out.exit_code == 0, out.output
    assert documents(mine) == [*documents(store), newer.tokens.tolist()]
    # --replace: exactly the imported store.
    out = tr("matrix", "import", model, str(exported), "--replace")
    assert out.exit_code == 0, out.output
    assert documents(mine) == documents(store)

    # A damaged or foreign store beside the input is refused before anything is written.
    before = {p.name: p.read_bytes() for p in mine.parent.iterdir() if p.is_file()}
    (tmp_path / "moved.store.safetensors").write_bytes(b"\x00" * 64)
    out = tr("matrix", "import", model, str(exported))
    assert out.exit_code == 1 and "not a valid tr recycled store file" in out.output
    assert "nothing was imported" in out.output
    write_recycled_store(
        tmp_path / "moved.store.safetensors", RecycledStoreFile(RecycledStoreMeta(49152, "0000000000000000", "x"), [])
    )
    out = tr("matrix", "import", model, str(exported))
    assert out.exit_code == 1 and "another tokenizer" in out.output and "pass --force to import anyway" in out.output
    assert {p.name: p.read_bytes() for p in mine.parent.iterdir() if p.is_file()} == before


def test_generate_adds_its_conversation_to_the_store(home, tiny_llama_dir):
    model = str(tiny_llama_dir)
    args = ["generate", model, "-p", "Tell me about cats and dogs.", "-n", "6", "--dtype", "float32", "--device", "cpu"]
    out = tr(*args)
    assert out.exit_code == 0, out.output
    store = recycled_store_path(matrix_file(home))
    # Its tokenizer is SmolLM2's: the store started from the starter's conversations.
    started = len(documents(store)) - 1
    assert "store: 1 conversation" in out.output
    before = store.read_bytes()
    out = tr(*args, "--no-save")
    assert out.exit_code == 0, out.output
    assert "+ store of" in out.output  # started from the stored conversation
    assert store.read_bytes() == before
    out = tr(*args, "--cold", "--no-save")
    assert out.exit_code == 0 and "cold matrix" in out.output and "+ store of" not in out.output
    assert store.read_bytes() == before
    assert tr(*args).exit_code == 0
    assert len(documents(store)) == started + 2
