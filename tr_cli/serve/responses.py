"""The OpenAI response shapes: whole responses, streamed chunks, usage, and tr's own `tr` object
with the decode statistics (the same definitions of MAT and tokens/s every tr command reports)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import __version__
from ..text.tools import ToolCall
from .logprobs import NamedToken, ShownLogprob
from .worker import Finished

ARGUMENT_CHUNK = 32  # characters of a call's arguments per streamed chunk

FINGERPRINT = f"tr-{__version__}"


def usage(finished: Finished) -> dict:
    """The tokens read and the tokens the client got (tr's statistics count every token decoded)."""
    prompt = finished.stats.prompt_tokens
    completion = finished.completion_tokens if finished.completion_tokens is not None else finished.stats.new_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def decode_stats(finished: Finished) -> dict:
    """The `tr` extension: how this reply was decoded."""
    stats = finished.stats
    return {
        "steps": stats.steps,
        "mean_accepted_tokens": round(stats.mean_accepted_tokens, 4),
        "tokens_per_second": round(stats.tokens_per_second, 3),
        "prompt_tokens_reused": finished.reused,
        "prefill_tokens": stats.prompt_tokens - finished.reused,
        "prefill_seconds": round(stats.prefill_seconds, 6),
        "decode_seconds": round(max(stats.wall_seconds - stats.prefill_seconds, 0.0), 6),
        "queue_seconds": round(finished.queue_seconds, 6),
    }


def _described(named: NamedToken) -> dict:
    return {"token": named.token, "logprob": named.logprob, "bytes": list(named.bytes)}


def chat_logprobs(entries: Sequence[ShownLogprob]) -> dict:
    """The chat API's `logprobs`: per token its text, log-probability, UTF-8 bytes and the most
    likely tokens there."""
    content = [{**_described(entry), "top_logprobs": [_described(alt) for alt in entry.top]} for entry in entries]
    return {"content": content, "refusal": None}


def text_logprobs(entries: Sequence[ShownLogprob]) -> dict:
    """The completions API's `logprobs`: parallel lists; each `top_logprobs` entry holds the chosen
    token too (the legacy API's "up to logprobs + 1")."""
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [
            {**{alt.token: alt.logprob for alt in entry.top}, entry.token: entry.logprob} for entry in entries
        ],
        "text_offset": [entry.offset for entry in entries],
    }


@dataclass
class Reply:
    """One response's identity (chat or text completion) and its builders."""

    chat: bool
    model: str
    # With tools offered: the finished text read as (content, calls); the reply is then held back
    # while it is decoded and streamed once read (calls as delta.tool_calls).
    read_calls: Callable[[str, bool], tuple[str | None, list[ToolCall]]] | None = None

    def __post_init__(self) -> None:
        self._read: tuple[str | None, list[ToolCall]] | None = None
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _logprobs(self, entries: Sequence[ShownLogprob] | None) -> dict | None:
        if entries is None:
            return None
        return chat_logprobs(entries) if self.chat else text_logprobs(entries)

    def _head(self, object_name: str) -> dict:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
        }

    def calls(self, finished: Finished) -> tuple[str | None, list[ToolCall], str]:
        """The reply's content, its tool calls and the finish reason ("tool_calls" when it calls; a
        call cut short by max_tokens is returned as far as it got, with "length")."""
        if self.read_calls is None:
            return finished.text, [], finished.finish_reason
        if self._read is None:  # once: each read names its calls afresh
            self._read = self.read_calls(finished.text, finished.finish_reason == "stop")
        content, calls = self._read
        return content, calls, "tool_calls" if calls and finished.finish_reason == "stop" else finished.finish_reason

    def whole(self, finished: Finished) -> dict:
        """The non-streamed response."""
        if self.chat:
            content, calls, reason = self.calls(finished)
            message: dict = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
            choice = {
                "index": 0,
                "message": message,
                "logprobs": self._logprobs(finished.logprobs),
                "finish_reason": reason,
            }
            head = self._head("chat.completion")
        else:
            logprobs = self._logprobs(finished.logprobs)
            choice = {"index": 0, "text": finished.text, "logprobs": logprobs, "finish_reason": finished.finish_reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(finished), "tr": decode_stats(finished)}

    def chunk(
        self,
        text: str | None = None,
        finish_reason: str | None = None,
        first: bool = False,
        logprobs: Sequence[ShownLogprob] | None = None,
        step: dict | None = None,
    ) -> dict:
        """A streamed chunk with text (the first chat chunk also names the role), the
        log-probabilities of the tokens it shows and the draft step behind it (`tr.step`), when
        asked for."""
        rendered = self._logprobs(logprobs)
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": rendered, "finish_reason": finish_reason}
            chunk = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": rendered, "finish_reason": finish_reason}
            chunk = {**self._head("text_completion"), "choices": [choice]}
        if step is not None:
            chunk["tr"] = {"step": step}
        return chunk

    def tool_chunks(self, finished: Finished) -> list[dict]:
        """With tools: the held-back reply, streamed as OpenAI streams it: the content, then per
        call a chunk with its index, id and name, then its arguments in pieces."""
        content, calls, _ = self.calls(finished)
        chunks = [self.chunk(content)] if content else []
        for index, call in enumerate(calls):
            head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            chunks.append(self._delta({"tool_calls": [head]}))
            for start in range(0, len(call.arguments), ARGUMENT_CHUNK):
                piece = call.arguments[start : start + ARGUMENT_CHUNK]
                chunks.append(self._delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        return chunks

    def _delta(self, delta: dict) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def last_chunk(self, finished: Finished) -> dict:
        """The chunk that ends the choice, with tr's statistics."""
        _, _, reason = self.calls(finished)
        return {**self.chunk(finish_reason=reason), "tr": decode_stats(finished)}

    def usage_chunk(self, finished: Finished) -> dict:
        """`stream_options.include_usage`: a last chunk with no choices and the usage."""
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": usage(finished)}


def sse(data: dict | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


SSE_DONE = sse("[DONE]")
SSE_KEEPALIVE = ": waiting\n\n"  # a comment line: clients ignore it, a closed connection shows
