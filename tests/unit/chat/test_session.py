"""ChatSession (tr_cli/chat/session.py): a conversation continued from the KV cache gives exactly
what generating from scratch on the same tokens gives (float32), after a full reply, after one cut
by max_new_tokens or Ctrl-C, after an EOS; /retry, /load, /system rebuild correctly; slash-command
parsing, completion, multi-line input and settings."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tr_cli.chat.commands import COMMANDS, complete, help_lines, parse_command
from tr_cli.chat.errors import CommandError, ContextFull
from tr_cli.chat.multiline import MultilineInput
from tr_cli.chat.session import ChatSession
from tr_cli.chat.settings import Settings
from tr_cli.chat.transcript import conversation_from_json, conversation_to_json
from tr_cli.core import TokenRecyclingDecoder
from tr_cli.core.sampling_config import SamplingConfig
from tr_cli.models import context_limit
from tr_cli.store.paths import cache_dir
from tr_cli.text.conversation import encode_prompt


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from tr_cli.models import Runtime, load_model

    return load_model(str(tiny_llama_dir), Runtime.resolve("cpu", "float32"), cache=cache_dir())


def greedy(loaded, ids: list[int], max_new_tokens: int) -> list[int]:
    prompt = torch.tensor([ids])
    eos = loaded.eos_token_ids
    with torch.inference_mode():
        out = loaded.model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=eos[0],
            eos_token_id=eos,
        )
    return out[0, len(ids) :].tolist()


def new_session(loaded, max_new_tokens: int = 12, **kwargs) -> ChatSession:
    decoder = TokenRecyclingDecoder(loaded.model)
    return ChatSession(
        loaded.tokenizer,
        decoder,
        loaded.eos_token_ids,
        settings=Settings(max_new_tokens=max_new_tokens),
        max_positions=context_limit(loaded.model),
        **kwargs,
    )


def turn(session: ChatSession, text: str, stop_after: int | None = None) -> list[int]:
    events = 0

    def stop() -> bool:
        return stop_after is not None and events >= stop_after

    for _ in session.reply(text, stop_requested=stop):
        events += 1
    return session.last.tokens


def check_next_turn_matches_generate(loaded, session: ChatSession, text: str) -> list[int]:
    """The next turn from the KV cache == greedy generate on (decoder.tokens + suffix)."""
    held = list(session.decoder.tokens)
    suffix, rebuild, _ = session.prepare(text)
    assert not rebuild, "expected a continuation from the KV cache"
    cached_before = session.decoder.cached_length
    reply = turn(session, text)
    assert session.last.input_tokens == len(suffix)
    assert cached_before > 0 and not session.last.rebuilt
    expected = greedy(loaded, held + suffix, session.settings.max_new_tokens)
    assert reply == expected
    return reply


def test_first_turn_is_encode_prompt_and_matches_generate(tiny):
    session = new_session(tiny)
    ids, rebuild, _ = session.prepare("Hello there")
    assert rebuild
    assert ids == encode_prompt(tiny.tokenizer, "Hello there")  # the rendering tokenizes as apply_chat_template does
    reply = turn(session, "Hello there")
    assert reply == greedy(tiny, ids, 12)
    assert session.decoder.tokens == ids + reply
    assert session.messages == [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": tiny.tokenizer.decode(reply, skip_special_tokens=True)},
    ]


def test_second_and_third_turn_continue_from_kv_cache(tiny):
    session = new_session(tiny)
    turn(session, "Hello there")  # the random model does not stop: cut by max_new_tokens
    assert session.last.stats.finish_reason == "length"
    suffix, _, _ = session.prepare("And then?")
    # The template closes the cut reply: the suffix starts with <|im_end|>.
    assert tiny.tokenizer.decode(suffix).startswith("<|im_end|>\n<|im_start|>user\nAnd then?")
    check_next_turn_matches_generate(tiny, session, "And then?")
    check_next_turn_matches_generate(tiny, session, "One more.")
    assert [m["role"] for m in session.messages] == ["user", "assistant"] * 3


def test_interrupted_reply_keeps_cache_consistent(tiny):
    session = new_session(tiny, max_new_tokens=40)
    reply = turn(session, "Tell me a long story", stop_after=2)  # Ctrl-C after two events
    assert session.last.interrupted and session.last.stats.finish_reason == "interrupted"
    assert 0 < len(reply) < 40
    assert session.messages[-1]["content"] == tiny.tokenizer.decode(reply, skip_special_tokens=True)
    session.settings.max_new_tokens = 10
    check_next_turn_matches_generate(tiny, session, "Go on.")


def test_ctrl_c_during_the_prefill_stops_it_and_the_next_turn_is_exact(tiny):
    """Ctrl-C while a long message is read stops between prefill chunks (it used to run the whole
    prefill, 30 s on 7,530 tokens, and show "1 tokens" without "interrupted"); the next turn reads
    the conversation again and equals generate."""
    session = new_session(tiny, max_new_tokens=10)
    turn(session, "Hello there")
    asked = []

    def stop() -> bool:
        asked.append(len(session.decoder.tokens))
        return True  # pressed before the first chunk was read

    events = list(session.reply("word " * 300, stop_requested=stop))
    assert events == [] and asked, "the decoder never asked before the prefill"
    assert session.last.interrupted and session.last.stats.finish_reason == "interrupted"
    assert session.last.tokens == [] and session.messages[-1] == {"role": "assistant", "content": ""}
    ids, rebuild, _ = session.prepare("Go on.")
    assert rebuild  # the decoder holds part of the cut message: the conversation is read again
    assert turn(session, "Go on.") == greedy(tiny, ids, 10)


def test_eos_reply_then_next_turn_smollm2(smollm2_fp32):
    loaded = smollm2_fp32
    session = new_session(loaded, max_new_tokens=6)
    first = turn(session, "Reply with one word: yes or no. Is water wet?")  # "No." and <|im_end|>
    assert session.last.stats.finish_reason == "eos" and first[-1] == 2
    suffix, rebuild, _ = session.prepare("Why?")
    assert not rebuild
    assert loaded.tokenizer.decode(suffix).startswith("\n<|im_start|>user\nWhy?")
    session.settings.max_new_tokens = 3
    check_next_turn_matches_generate(loaded, session, "Why?")


def test_retry_regenerates_the_same_greedy_reply(tiny):
    session = new_session(tiny)
    turn(session, "Hello there")
    second = turn(session, "And then?")
    history = [dict(m) for m in session.messages]
    for _ in session.retry():
        pass
    assert session.last.rebuilt and session.last.tokens == second
    assert session.messages == history


def test_load_and_system_change_rebuild_from_the_rendering(tiny, tmp_path):
    session = new_session(tiny)
    turn(session, "Hello there")
    turn(session, "And then?")
    path = session.save(tmp_path / "conversation.json")
    data = json.loads(path.read_text())
    assert data["format"] == "tr-chat" and len(data["messages"]) == 4

    other = new_session(tiny)
    assert other.load(path) == 4
    assert other.messages == session.messages and not other.decoder.tokens
    ids, rebuild, rendered = other.prepare("Third.")
    assert rebuild and ids == tiny.tokenizer.encode(rendered, add_special_tokens=False)
    reply = turn(other, "Third.")
    assert other.last.rebuilt and reply == greedy(tiny, ids, 12)

    other.set_system("You are terse.")
    ids, rebuild, rendered = other.prepare("Fourth.")
    assert rebuild and rendered.startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    assert turn(other, "Fourth.") == greedy(tiny, ids, 12)
    check_next_turn_matches_generate(tiny, other, "Fifth.")


def test_clear_forgets_conversation_not_matrix(tiny):
    session = new_session(tiny)
    turn(session, "Hello there")
    matrix = session.decoder.matrix.clone()
    message, action = session.execute("/clear", "")
    assert action is None and "cleared" in message
    assert session.messages == [] and session.decoder.tokens == []
    assert torch.equal(session.decoder.matrix, matrix) and bool(matrix.any())
    ids, rebuild, _ = session.prepare("Hi")
    assert rebuild and ids == encode_prompt(tiny.tokenizer, "Hi")


@pytest.mark.parametrize("piped", [False, True])
def test_context_full_is_a_message_not_a_crash(tiny, piped):
    session = new_session(tiny, max_new_tokens=50)
    session.max_positions = 80
    session.piped = piped
    turn(session, "Hello there")
    assert len(session.decoder.tokens) <= 80 - session.decoder.max_depth  # reply capped to the room left
    with pytest.raises(ContextFull) as full:
        session.reply("More?")
    assert [m["role"] for m in session.messages] == ["user", "assistant"]
    message = str(full.value)
    assert message.startswith("the conversation fills the model's context (80 tokens)")
    if piped:  # no slash commands on stdin: what to change in the next run instead
        assert "/clear" not in message
        assert "after 1 message; pipe fewer --each-line messages per run" in message
        assert "lower --max-new-tokens" in message
    else:
        assert message.endswith("; /clear starts a new one")


@pytest.mark.parametrize("piped", [False, True])
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_a_message_too_long_alone_asks_for_a_shorter_one(tiny, piped, system):
    """/clear cannot help a message that does not fit an empty conversation."""
    session = new_session(tiny, system=system)
    session.max_positions = 80
    session.piped = piped
    with pytest.raises(ContextFull) as full:
        session.reply("word " * 100)
    assert session.messages == []
    expected = {
        (False, None): "this message leaves no room for a reply in the model's context (80 tokens); send a shorter one",
        (False, "Be brief."): "this message leaves no room for a reply in the model's context (80 tokens); "
        "send a shorter one (or a shorter /system prompt)",
        (True, None): "the message from stdin leaves no room for a reply in the model's context (80 tokens); "
        "pipe in a shorter one",
        (True, "Be brief."): "the message from stdin leaves no room for a reply in the model's context "
        "(80 tokens); pipe in a shorter one (or a shorter --system)",
    }
    assert str(full.value) == expected[piped, system]


class PlainTokenizer:
    """A tokenizer without a chat template (plain-completion mode), over the tiny model's own."""

    chat_template = None

    def __init__(self, inner) -> None:
        self.inner = inner

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + self.inner.encode(text, add_special_tokens=False)

    def decode(self, ids, skip_special_tokens=False):
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_plain_completion_mode_appends_text(tiny):
    tokenizer = PlainTokenizer(tiny.tokenizer)
    session = ChatSession(
        tokenizer, TokenRecyclingDecoder(tiny.model), tiny.eos_token_ids, settings=Settings(max_new_tokens=8)
    )
    assert not session.templated
    ids, rebuild, _ = session.prepare("Once upon a time")
    assert rebuild and ids == tokenizer.encode("Once upon a time")
    first = turn(session, "Once upon a time")
    assert first == greedy(tiny, ids, 8)
    held = list(session.decoder.tokens)
    suffix, rebuild, _ = session.prepare(" and then")
    assert not rebuild and suffix == tokenizer.encode(" and then", add_special_tokens=False)
    assert turn(session, " and then") == greedy(tiny, held + suffix, 8)
    assert "plain-completion" in session.show("template")


# -- commands, input, settings: no model needed ---------------------------------------------------


def test_parse_command_and_unknown_commands():
    assert parse_command("/help") == ("/help", "")
    assert parse_command("/?") == ("/help", "")
    assert parse_command("/exit") == ("/bye", "")
    assert parse_command("/set max_new_tokens 20") == ("/set", "max_new_tokens 20")
    assert parse_command("  /SYSTEM  Be brief. ") == ("/system", "Be brief.")
    with pytest.raises(CommandError, match=r"^Unknown command /x — /help lists them$"):
        parse_command("/x")


def test_every_command_has_help():
    names = {usage.split()[0].rstrip(",") for usage, _ in help_lines()}
    for spec in COMMANDS:
        assert spec.name in names
    listed = " ".join(usage for usage, _ in help_lines())
    for name in ("/help", "/?", "/clear", "/system", "/set", "/show", "/save", "/load", "/retry", "/bye", "/exit"):
        assert name in listed


def test_completion_of_slash_commands():
    assert complete("/he") == ["/help"]
    assert complete("/s") == ["/system", "/set", "/show", "/save"]
    assert complete("/set ma") == ["max_new_tokens"]
    assert complete("/set live t") == ["tree"]
    assert complete("/set t") == ["temperature", "top_p", "top_k"]
    assert complete("/set seed r") == ["random"] and complete("/set top_p d") == ["default"]
    assert complete("/show t") == ["template"]
    assert complete("hello") == []
    assert complete("/nope x") == []


@pytest.mark.parametrize(
    "lines, expected",
    [
        (["hello"], ("hello", False)),
        (['"""one line"""'], ("one line", True)),
        (['"""', "first", "", "second", '"""'], ("first\n\nsecond", True)),
        (['"""first', 'second"""'], ("first\nsecond", True)),
        (['"""', "/not a command", '"""'], ("/not a command", True)),
    ],
)
def test_multiline_input(lines, expected):
    block = MultilineInput()
    results = [block.feed(line) for line in lines]
    assert results[:-1] == [None] * (len(lines) - 1)
    assert results[-1] == expected
    assert not block.active


def test_settings():
    settings = Settings()
    assert settings.set("max_new_tokens", "20") == "max_new_tokens = 20" and settings.max_new_tokens == 20
    assert settings.set("live", "tree") == "live = tree"
    assert settings.set("verbose", "") == "verbose = on" and settings.verbose
    assert settings.set("verbose", "off") == "verbose = off" and not settings.verbose
    assert settings.sampling_config(None).is_greedy
    assert settings.set("top-p", "0.9") == "top_p = 0.9" and settings.sampling.top_p == 0.9
    # top_p without a temperature samples at the model's temperature (transformers' default: 1.0).
    assert settings.sampling_config(None) == SamplingConfig(temperature=1.0, top_k=50, top_p=0.9)
    assert settings.set("temperature", "0.7") == "temperature = 0.7"
    assert settings.set("top_k", "5") == "top_k = 5" and settings.set("seed", "42") == "seed = 42"
    assert settings.set("repetition_penalty", "1.2") == "repetition_penalty = 1.2"
    assert settings.sampling_config(None) == SamplingConfig(
        temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.2, seed=42
    )
    assert settings.set("seed", "random") == "seed = random" and settings.sampling.seed is None
    assert settings.set("top_k", "default") == "top_k = default" and settings.sampling.top_k is None
    assert settings.set("temperature", "0") == "temperature = 0" and settings.sampling_config(None).is_greedy
    for key, value, words in (
        ("max_new_tokens", "0", "at least 1"),
        ("max_new_tokens", "many", "whole number"),
        ("live", "fancy", "live takes"),
        ("verbose", "maybe", "on or off"),
        ("colour", "red", "no setting"),
        ("temperature", "-1", "temperature must be 0 (greedy) or more"),
        ("temperature", "hot", "temperature takes a number"),
        ("top_p", "2", "top_p must be between 0 and 1"),
        ("top_k", "2.5", "top_k takes a whole number"),
        ("repetition_penalty", "0", "more than 0"),
        ("seed", "-4", "seed must be between"),
        ("seed", "", "usage: /set seed"),
    ):
        with pytest.raises(CommandError, match=re.escape(words)):
            settings.set(key, value)


def test_set_sampling_in_a_conversation(tiny):
    """/set temperature switches the decoder to sampling (the model's defaults merged in), a seed
    makes a reply reproducible, /set temperature 0 is greedy again, and a sampled conversation
    still continues from the KV cache."""
    session = new_session(tiny, max_new_tokens=10)
    assert session.decoder.sampler is None
    message, _ = session.execute("/set", "temperature 0.8")
    assert message == "temperature = 0.8 (sampling: temperature 0.8, top_p 1, top_k 50, seed random)"
    assert session.decoder.sampling == SamplingConfig(temperature=0.8, top_k=50, top_p=1.0)
    session.execute("/set", "seed 3")
    first = turn(session, "Hello there")
    second = turn(session, "And then?")
    assert not session.last.rebuilt  # continued from the cache
    replay = new_session(tiny, max_new_tokens=10)
    replay.execute("/set", "temperature 0.8")
    replay.execute("/set", "seed 3")
    assert (turn(replay, "Hello there"), turn(replay, "And then?")) == (first, second)
    assert "decoding        sampling: temperature 0.8, top_p 1, top_k 50, seed 3" in session.show("settings")
    session.execute("/set", "temperature 0")
    assert session.decoder.sampler is None and "decoding        greedy" in session.show("settings")
    check_next_turn_matches_generate(tiny, session, "Greedy again?")


def test_conversation_json_round_trip():
    messages = [{"role": "user", "content": "hi [bold]"}, {"role": "assistant", "content": "héllo"}]
    data = conversation_to_json("Be brief.", messages, "model-x")
    assert conversation_from_json(json.loads(json.dumps(data))) == ("Be brief.", messages)
    # An OpenAI-style list with the system message first is accepted too.
    assert conversation_from_json([{"role": "system", "content": "S"}, *messages]) == ("S", messages)
    for bad in ({}, {"messages": [{"role": "tool", "content": "x"}]}, {"messages": [{"role": "user"}]}, 3):
        with pytest.raises(ValueError):
            conversation_from_json(bad)
