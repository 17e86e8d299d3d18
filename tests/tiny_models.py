"""Tiny random-weight models of several architectures, built from configs (no downloads)."""

from __future__ import annotations

import functools

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 320
EOS = 3
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    eos_token_id=EOS,
    bos_token_id=1,
    pad_token_id=0,
)

# Sliding windows are far smaller than prompt + generation, so masking bugs show up.
WINDOW = 12


def _build(name: str):
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **COMMON))
    if name == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, **COMMON))
    if name == "qwen2-swa":  # full and sliding layers mixed: masks go in as a dict per layer type
        return Qwen2ForCausalLM(
            Qwen2Config(
                num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, **COMMON
            )
        )
    if name == "qwen3":  # per-head q/k RMS norms
        return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, head_dim=16, **COMMON))
    if name == "qwen3-gguf":  # Qwen3's real head dim (128): transformers' GGUF config map reads none for qwen3
        return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, head_dim=128, **COMMON))
    if name == "phi3":  # q/k/v and gate/up each one projection in the checkpoint; rotary over half a head
        return Phi3ForCausalLM(Phi3Config(num_hidden_layers=2, partial_rotary_factor=0.5, **COMMON))
    if name == "phi3-gguf":  # Phi-3's real vocabulary (32,064): its config's default pad id, 32000, must fit
        config = {**COMMON, "vocab_size": 32064}
        return Phi3ForCausalLM(Phi3Config(num_hidden_layers=2, **config))
    if name == "mistral":  # every layer sliding: one 4D mask that itself applies the window
        return MistralForCausalLM(MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **COMMON))
    if name == "gemma2":
        return Gemma2ForCausalLM(Gemma2Config(num_hidden_layers=2, head_dim=16, sliding_window=WINDOW, **COMMON))
    if name == "gemma3":
        return Gemma3ForCausalLM(
            Gemma3TextConfig(
                num_hidden_layers=3,
                head_dim=16,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                **COMMON,
            )
        )
    if name == "gemma3-untied":  # Gemma 3 with an output head of its own
        config = {**COMMON, "tie_word_embeddings": False}
        return Gemma3ForCausalLM(Gemma3TextConfig(num_hidden_layers=2, head_dim=16, sliding_window=WINDOW, **config))
    if name == "gemma3-262k":  # Gemma 3's real vocabulary size, for the head
        config = {**COMMON, "vocab_size": 262144}
        return Gemma3ForCausalLM(Gemma3TextConfig(num_hidden_layers=2, head_dim=16, sliding_window=WINDOW, **config))
    if name == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(
                vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=1024, eos_token_id=EOS, bos_token_id=1
            )
        )
    raise ValueError(name)


ARCHITECTURES = ["llama", "qwen2", "qwen2-swa", "qwen3", "phi3", "mistral", "gemma2", "gemma3", "gpt2"]


# Weight std (embeddings, other matrices). Default inits give near-flat logits, and the models then
# repeat one token forever; these give varied text with some repetition, so drafts are sometimes
# right and often wrong. Gemma scales embeddings by sqrt(hidden), hence its smaller embedding std.
_INIT_STD = {"gemma2": (0.01, 0.2), "gemma3": (0.01, 0.2), "gemma3-untied": (0.01, 0.2), "gemma3-262k": (0.01, 0.2)}


def tiny_model(name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return randomized(_build(name), *_INIT_STD.get(name, (0.1, 0.1))).to(dtype)


def randomized(model: torch.nn.Module, embed_std: float = 0.1, std: float = 0.1) -> torch.nn.Module:
    """`model` with its matrices drawn from N(0, std) (embeddings: embed_std) from torch's current
    seed, in eval mode, generating until EOS: the tiny models' weights."""
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, embed_std if "embed" in param_name or param_name.endswith("wte.weight") else std)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    return model.eval()


def reference(model, ids: list[int], max_new_tokens: int, eos: int = EOS) -> list[int]:
    return reference_with_logprobs(model, ids, max_new_tokens, eos, logprobs=False)[0]


def reference_with_logprobs(
    model, ids: list[int], max_new_tokens: int, eos: int = EOS, logprobs: bool = True, processors: list | None = None
) -> tuple[list[int], torch.Tensor | None]:
    """generate's greedy tokens (EOS included) and, with `logprobs`, the log-softmax of its own
    logits at each (new tokens, vocabulary); `processors`: logits processors it applies."""
    prompt = torch.tensor([ids])
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        output_logits=logprobs,
        return_dict_in_generate=True,
        logits_processor=processors,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    return tokens, torch.log_softmax(torch.cat(out.logits).float(), dim=-1) if logprobs else None


def random_prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB, (length,), generator=g).tolist()


_CORPUS = [
    '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "poetry"]}',
    '{"city": "Paris", "country": "France", "population": 2148000, "capital": true, "mayor": null}',
    '{"items": [{"id": 1, "title": "first"}, {"id": 2, "title": "second"}], "total": 2}',
    "The quick brown fox jumps over the lazy dog. Numbers 0123456789 and quotes \" ' here.",
]


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """A real fast tokenizer for the tiny models' vocabulary: byte-level BPE trained on a little
    JSON, the four specials first (id 3 is EOS), exactly VOCAB tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "<pad>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    assert tokenizer.get_vocab_size() == VOCAB and tokenizer.token_to_id("</s>") == EOS
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", pad_token="<pad>", eos_token="</s>"
    )
