"""The context length read from a config alone (before the weights load, so that `tr generate`
refuses a prompt past it at once) is the one the loaded model states."""

from __future__ import annotations

from transformers import LlamaConfig, LlavaConfig, Phi3Config

from tr_cli.models.load import config_context_limit, context_limit

from tiny_models import tiny_model


def test_a_plain_config_states_its_max_positions():
    assert config_context_limit(LlamaConfig(max_position_embeddings=512)) == 512


def test_a_multimodal_config_states_its_text_decoders():
    config = LlavaConfig(text_config=LlamaConfig(max_position_embeddings=777).to_dict())
    assert config_context_limit(config) == 777


def test_no_stated_limit_is_none():
    assert config_context_limit(None) is None
    assert config_context_limit(LlamaConfig(max_position_embeddings=0)) is None


def test_a_loaded_model_states_its_configs():
    model = tiny_model("llama")
    assert context_limit(model) == model.config.max_position_embeddings > 0


def test_a_longrope_model_stops_at_its_pretraining_context():
    """Past it transformers switches to the long factors and recomputes every position; a kept
    KV cache rotated with the short ones could not give `generate`'s tokens."""
    scaling = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
        "original_max_position_embeddings": 4096,
    }
    config = Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=131072, rope_parameters=scaling)
    assert config_context_limit(config) == 4096
    assert config_context_limit(Phi3Config(max_position_embeddings=131072)) == 131072
