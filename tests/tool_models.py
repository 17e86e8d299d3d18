"""Tiny random-weight checkpoints that speak tools the way real models do: a Hermes/Qwen-style chat
template whose `<tool_call>` and `</tool_call>` are single added tokens (as in Qwen2.5's
tokenizer, where they are not marked special), and the tokenizer of a template without tools."""

from __future__ import annotations

from pathlib import Path

TOOL_TAGS = ("<tool_call>", "</tool_call>")

HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}Functions you may call, inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Return each call as <tool_call>
{"name": <name>, "arguments": <arguments object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def with_tool_tags(tokenizer):
    """`tokenizer` with `<tool_call>` and `</tool_call>` added as single tokens, not special (Qwen2.5's)."""
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    return tokenizer


def tool_checkpoint(directory: Path, tokenizer_dir: Path, hermes: bool = True, ends_values: bool = False) -> Path:
    """A 2-layer random-weight Llama in `directory` speaking through the tokenizer in
    `tokenizer_dir`: with `hermes`, the tool tags added as tokens and HERMES_TEMPLATE as its chat
    template (else the tokenizer's own template). `ends_values`: the model writes what ends a
    JSON value (a closing quote) and the end of the turn wherever the grammar lets it, as real
    models do; random weights alone would fill every unbounded string up to the token limit."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if hermes:
        tokenizer = with_tool_tags(tokenizer)
        tokenizer.chat_template = HERMES_TEMPLATE
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer) + 64 - len(tokenizer) % 64,  # rows past the tokenizer, as real models have
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(config)
    if ends_values:
        # Every hidden state leans on dimension 0 (its embedding dominates the residual stream), and
        # only the end of turn and the tokens that start with a quote read it: those win where allowed.
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 20.0
            model.lm_head.weight[:, 0] = 0.0
            quotes = [i for token, i in tokenizer.get_vocab().items() if token.startswith('"')]
            model.lm_head.weight[quotes, 0] = 1.0
            model.lm_head.weight[tokenizer.eos_token_id, 0] = 2.0
    model.save_pretrained(directory)
    return directory


def hermes_checkpoint(directory: Path, tokenizer_dir: Path) -> Path:
    """tool_checkpoint's Hermes model with random weights."""
    return tool_checkpoint(directory, tokenizer_dir)
