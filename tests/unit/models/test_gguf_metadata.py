"""A GGUF's config and tokenizer read with the vocabulary parsed once (gguf_metadata.py) are what
transformers' own AutoConfig and AutoTokenizer make from the file: the same config, the same saved
tokenizer files, the same token ids."""

from pathlib import Path

import pytest
from gguf import GGUFReader
from tiny_gguf import write_tiny_gguf
from transformers import AutoConfig, AutoTokenizer

from tr_cli.models.gguf_header import read_header
from tr_cli.models.gguf_metadata import fast_side_files, stripped_header

from tiny_models import tiny_model

pytest.importorskip("transformers.integrations.gguf", reason="this transformers has no fast GGUF tokenizer reader")

TEXT = "def f(x):\n    return x ** 2  # three colors, naïve café\t<|endoftext|> done"


def transformers_side_files(path: Path):
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name), tokenizer


def saved(tokenizer, directory: Path) -> dict[str, bytes]:
    tokenizer.save_pretrained(directory)
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def config_fields(config) -> dict:
    fields = config.to_dict()
    fields.pop("_name_or_path", None)  # where it was read from, which differs by construction
    return fields


def assert_same_side_files(path: Path, tmp_path: Path, longest: int) -> None:
    config, tokenizer = fast_side_files(path, read_header(path), tmp_path, longest)
    expected_config, expected_tokenizer = transformers_side_files(path)
    assert config_fields(config) == config_fields(expected_config)
    assert type(tokenizer) is type(expected_tokenizer)
    assert saved(tokenizer, tmp_path / "fast") == saved(expected_tokenizer, tmp_path / "transformers")
    assert tokenizer(TEXT).input_ids == expected_tokenizer(TEXT).input_ids
    assert not list(tmp_path.glob(".header-*")), "the stripped header's scratch file is left behind"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_config_and_tokenizer_equal_transformers_own(tmp_path, arch):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", tiny_model(arch))
    # The tiny vocabulary (320 tokens) is emptied from the header as a real one is.
    assert read_header(path).array_lengths["tokenizer.ggml.tokens"] > 16
    assert_same_side_files(path, tmp_path, longest=16)


def test_a_real_size_vocabulary_is_stripped_at_the_default_bound(tmp_path):
    path = write_tiny_gguf(tmp_path / "phi3.gguf", tiny_model("phi3-gguf"))  # 32,064 tokens
    header = read_header(path)
    stripped = tmp_path / "stripped.gguf"
    stripped.write_bytes(stripped_header(path, header))
    reader = GGUFReader(stripped)
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 0
    assert [t.name for t in reader.tensors] == [t.name for t in header.tensors]
    assert stripped.stat().st_size < 64_000 < path.stat().st_size
    assert_same_side_files(path, tmp_path, longest=4096)


def renamed_key(source: Path, target: Path, key: str, new_key: str) -> Path:
    """`source` with one metadata key renamed (same length: every offset after it stays)."""
    assert len(new_key) == len(key)
    start = next(start for name, start, _ in read_header(source).spans if name == key)
    data = bytearray(source.read_bytes())
    data[start + 8 : start + 8 + len(key)] = new_key.encode()
    target.write_bytes(bytes(data))
    return target


def test_a_file_without_vocab_size_gets_the_number_of_tokens_as_transformers_does(tmp_path):
    path = write_tiny_gguf(tmp_path / "full.gguf", tiny_model("qwen2"))
    assert read_header(path).has("qwen2.vocab_size")
    cut = renamed_key(path, tmp_path / "cut.gguf", "qwen2.vocab_size", "qwen2.unknown_xx")
    assert not read_header(cut).has("qwen2.vocab_size")
    config, _ = fast_side_files(cut, read_header(cut), tmp_path, longest=16)
    assert config.vocab_size == read_header(cut).array_lengths["tokenizer.ggml.tokens"]
    assert_same_side_files(cut, tmp_path, longest=16)
