"""One conversation encoder: `tr bench` (each turn re-encoded with the earlier replies as text) and
`tr chat` (a conversation rebuilt from its messages) produce the same token stream, for a model
with a chat template and for one without (plain-completion mode), with and without a system
prompt, turn after turn."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from tr_cli.bench.run import Run
from tr_cli.bench.runner import conversation_turns, run_bench
from tr_cli.chat.session import ChatSession
from tr_cli.chat.settings import Settings
from tr_cli.core import TokenRecyclingDecoder
from tr_cli.text.conversation import ConversationEncoder, encode_prompt, messages_of
from tr_cli.text.prompts import PromptRecord

TURNS = ("Hello there, who are you?", "Tell me more about it.", "And what then?")
REPLIES = ("I am a small model.", "It is a long story, in short.", "Then it ends.")


@pytest.fixture(scope="module", params=["template", "plain"])
def tokenizer(request, smollm2_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    if request.param == "plain":
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = None
    return tokenizer


@pytest.fixture(scope="module")
def decoder():
    from tiny_models import tiny_model

    return TokenRecyclingDecoder(tiny_model("llama"))  # never run here: chat only asks it what it holds


def bench_streams(tokenizer, system: str | None) -> list[list[int]]:
    """The ids bench feeds a method at each turn, the method answering REPLIES."""
    seen: list[list[int]] = []
    replies = iter(REPLIES)

    def method(ids: list[int], max_new_tokens: int, grammar: object) -> Run:
        seen.append(ids)
        return Run(list(tokenizer.encode(next(replies), add_special_tokens=False)), 0.1, 1)

    encoder = ConversationEncoder(tokenizer)
    run_bench(
        {"m": method},
        [PromptRecord("1", "chat", TURNS)],
        conversation_turns(encoder, system),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        max_new_tokens=8,
        warmup=0,
    )
    return seen


@pytest.mark.parametrize("system", [None, "Answer briefly."])
def test_bench_and_chat_feed_the_same_tokens(tokenizer, decoder, system):
    streams = bench_streams(tokenizer, system)
    assert len(streams) == len(TURNS)
    for turn, ids in enumerate(streams):
        session = ChatSession(tokenizer, decoder, [2], system=system, settings=Settings(max_new_tokens=8))
        history = [
            message
            for user, reply in zip(TURNS[:turn], REPLIES[:turn], strict=True)
            for message in ({"role": "user", "content": user}, {"role": "assistant", "content": reply})
        ]
        session.replace(system, history)
        prompt = session.prepare(TURNS[turn])
        assert prompt.rebuild and prompt.ids == ids, f"turn {turn + 1}"


def test_a_first_turn_is_encode_prompt(tokenizer):
    encoder = ConversationEncoder(tokenizer)
    assert encoder.encode(messages_of([], TURNS[0])).ids == encode_prompt(tokenizer, TURNS[0])


def test_template_mode_renders_the_chat_template(tokenizer):
    encoder = ConversationEncoder(tokenizer)
    prompt = encoder.encode(messages_of([(TURNS[0], REPLIES[0])], TURNS[1], "Be kind."))
    if not encoder.templated:
        # Plain mode: the texts one after the other, the system prompt first and set off.
        assert (
            tokenizer.decode(prompt.ids, skip_special_tokens=True) == "Be kind.\n\n" + TURNS[0] + REPLIES[0] + TURNS[1]
        )
        assert prompt.rendered == ""
        return
    assert prompt.rendered.startswith("<|im_start|>system\nBe kind.<|im_end|>")
    assert prompt.rendered.endswith("<|im_start|>assistant\n")
    assert prompt.ids == tokenizer.encode(prompt.rendered, add_special_tokens=False)


def test_continuation_extends_what_the_decoder_holds(tokenizer):
    """After a reply, the next turn feeds only what follows the held text; when the template writes
    the history otherwise, the whole conversation is encoded again."""
    encoder = ConversationEncoder(tokenizer)
    first = encoder.encode(messages_of([], TURNS[0]))
    reply = list(tokenizer.encode(REPLIES[0], add_special_tokens=False)) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    held = encoder.held_after(first, reply)
    nxt = encoder.continuation(held, messages_of([(TURNS[0], REPLIES[0])], TURNS[1]))
    assert not nxt.rebuild
    if encoder.templated:
        assert first.ids + reply + nxt.ids == encoder.encode(messages_of([(TURNS[0], REPLIES[0])], TURNS[1])).ids
        rewritten = encoder.continuation(held, messages_of([(TURNS[0], "Another reply.")], TURNS[1]))
        assert rewritten.rebuild
    else:
        assert nxt.ids == tokenizer.encode(TURNS[1], add_special_tokens=False)
