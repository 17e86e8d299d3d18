"""The OpenAI response shapes (tr_cli/serve/responses.py) built from a finished decode, without a
server: whole responses, streamed chunks, usage, tr's decode statistics, and the SSE framing."""

import json

import pytest

from tr_cli.core.events import GenerationResult, GenerationStats
from tr_cli.serve.responses import FINGERPRINT, SSE_DONE, Reply, decode_stats, sse, usage
from tr_cli.serve.worker import Finished


def finished(text: str = "Hello there", reason: str = "stop", reused: int = 0, **stats) -> Finished:
    numbers = dict(prompt_tokens=12, new_tokens=9, steps=4, step_tokens=8, prefill_seconds=0.25, wall_seconds=1.75)
    result = GenerationResult(tokens=list(range(9)), stats=GenerationStats(**{**numbers, **stats}))
    return Finished(text, reason, result, reused, queue_seconds=0.5)


def test_usage_counts_prompt_and_completion_tokens():
    assert usage(finished()) == {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}


def test_decode_stats_split_the_prompt_and_the_time():
    stats = decode_stats(finished(reused=5))
    assert stats == {
        "steps": 4,
        "mean_accepted_tokens": 2.0,  # 8 tokens over 4 steps (the prefill's token not counted)
        "tokens_per_second": round(9 / 1.75, 3),
        "prompt_tokens_reused": 5,
        "prefill_tokens": 7,  # 12 prompt tokens, 5 of them from the cache
        "prefill_seconds": 0.25,
        "decode_seconds": 1.5,  # wall time less the prefill
        "queue_seconds": 0.5,
    }


def test_decode_stats_with_no_step_and_no_time():
    stats = decode_stats(finished(new_tokens=1, steps=0, step_tokens=0, prefill_seconds=0.0, wall_seconds=0.0))
    assert stats["mean_accepted_tokens"] == 1.0 and stats["tokens_per_second"] == 0.0
    assert stats["decode_seconds"] == 0.0


def test_decode_seconds_never_go_negative():
    assert decode_stats(finished(prefill_seconds=0.3, wall_seconds=0.2))["decode_seconds"] == 0.0


@pytest.mark.parametrize("chat", [True, False])
def test_a_whole_response(chat):
    reply = Reply(chat, "tiny")
    body = reply.whole(finished(reason="length"))
    assert body["id"].startswith("chatcmpl-" if chat else "cmpl-") and body["id"] == reply.id
    assert body["object"] == ("chat.completion" if chat else "text_completion")
    assert (body["model"], body["system_fingerprint"], body["created"]) == ("tiny", FINGERPRINT, reply.created)
    [choice] = body["choices"]
    assert (choice["index"], choice["finish_reason"], choice["logprobs"]) == (0, "length", None)
    if chat:
        assert choice["message"] == {"role": "assistant", "content": "Hello there"} and "text" not in choice
    else:
        assert choice["text"] == "Hello there" and "message" not in choice
    assert body["usage"]["total_tokens"] == 21 and body["tr"]["steps"] == 4
    json.dumps(body)  # serializable as it is


def test_replies_have_their_own_ids():
    assert len({Reply(True, "m").id for _ in range(20)}) == 20


def test_chat_chunks_name_the_role_first_then_carry_text_and_share_the_reply_id():
    reply = Reply(True, "tiny")
    first, middle, last = reply.chunk("", first=True), reply.chunk("lo"), reply.last_chunk(finished())
    assert {c["id"] for c in (first, middle, last)} == {reply.id}
    assert {c["object"] for c in (first, middle, last)} == {"chat.completion.chunk"}
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert middle["choices"][0]["delta"] == {"content": "lo"} and middle["choices"][0]["finish_reason"] is None
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    assert last["tr"] == decode_stats(finished()) and "usage" not in last


def test_text_chunks_carry_text_and_the_last_one_its_reason():
    reply = Reply(False, "tiny")
    chunk, last = reply.chunk("lo"), reply.last_chunk(finished(reason="length"))
    assert chunk["object"] == last["object"] == "text_completion"
    assert chunk["choices"] == [{"index": 0, "text": "lo", "logprobs": None, "finish_reason": None}]
    assert last["choices"] == [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]


@pytest.mark.parametrize(("chat", "object_name"), [(True, "chat.completion.chunk"), (False, "text_completion")])
def test_the_usage_chunk_has_no_choices(chat, object_name):
    reply = Reply(chat, "tiny")
    chunk = reply.usage_chunk(finished())
    assert chunk["choices"] == [] and chunk["usage"] == usage(finished())
    assert chunk["object"] == object_name and chunk["id"] == reply.id


def test_sse_frames_one_json_event_and_keeps_text_unescaped():
    event = sse({"text": "café ☕", "n": 1})
    assert event.startswith("data: ") and event.endswith("\n\n") and event.count("\n") == 2
    assert json.loads(event.removeprefix("data: ")) == {"text": "café ☕", "n": 1}
    assert "café ☕" in event  # UTF-8 on the wire, not \u escapes
    assert SSE_DONE == "data: [DONE]\n\n"
