"""One vocabulary size: the matrix has as many rows as the model's logits (its output embedding),
whether the model is loaded or only its tokenizer and config are read. A model whose config
`vocab_size` differs from its output rows (Inkling 2 pads the input embedding, not the head) gets
one matrix file that `tr matrix init` writes and `tr matrix inspect` finds."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tr_cli.cli import app
from tr_cli.models import Runtime, load_model, load_tokenizer
from tr_cli.store.paths import cache_dir

CONFIG_ROWS, OUTPUT_ROWS = 384, 320
TEXT = (
    "Token Recycling keeps the candidates every forward pass computes. The matrix remembers, for each token, "
    "the tokens that followed it; a draft tree is read from it and verified in one pass. "
) * 4


def tiny_tokenizer(directory, size: int) -> None:
    """A byte-level BPE tokenizer of `size` ids trained here (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([TEXT], trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(directory)


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory):
    """A tiny random-weight Inkling 2 whose config says 384 ids while its head has 320 rows."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.inkling2.configuration_inkling2 import Inkling2TextConfig

    directory = tmp_path_factory.mktemp("padded-vocab")
    config = Inkling2TextConfig(
        vocab_size=CONFIG_ROWS,
        unpadded_vocab_size=OUTPUT_ROWS,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        swa_num_attention_heads=2,
        swa_num_key_value_heads=1,
        swa_head_dim=16,
        sliding_window_size=16,
        d_rel=4,
        rel_extent=32,
        layer_types=["hybrid_sliding", "hybrid"],
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_layers_per_attn_res_block=1,
        max_position_embeddings=256,
        eos_token_id=2,
        bos_token_id=1,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tiny_tokenizer(directory, 300)
    return directory


def test_the_two_sizes_really_differ(padded_dir):
    config = json.loads((padded_dir / "config.json").read_text())
    assert config["vocab_size"] == CONFIG_ROWS != OUTPUT_ROWS


def test_loaded_and_unloaded_models_agree_on_the_rows(padded_dir):
    _, rows, _ = load_tokenizer(str(padded_dir), cache=cache_dir())
    assert (
        rows
        == load_model(str(padded_dir), Runtime.resolve("cpu", "float32"), cache=cache_dir()).vocab_size
        == OUTPUT_ROWS
    )


def test_matrix_init_writes_what_inspect_finds(padded_dir, tmp_path, home, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    runner = CliRunner()
    init = runner.invoke(app, ["matrix", "init", str(padded_dir), "--from", str(corpus), "--dtype", "float32"])
    assert init.exit_code == 0, init.output
    inspect = runner.invoke(app, ["matrix", "inspect", str(padded_dir), "--json"])
    assert inspect.exit_code == 0, inspect.output
    report = json.loads(inspect.stdout)
    assert report["shape"] == [OUTPUT_ROWS, 8] and report["rows_filled"] > 0
