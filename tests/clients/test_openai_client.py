"""The official `openai` client: parse() with a pydantic model, tool calls required, named and
auto, streamed calls."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from client_server import needs

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int


def api(tr_server):
    openai = needs("openai")
    return openai.OpenAI(base_url=tr_server.base_url, api_key="unused", max_retries=0)


def weather_call(call) -> dict:
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)  # closed: no invented keys
    return arguments


def test_parse_returns_the_model(tr_server):
    reply = api(tr_server).chat.completions.parse(
        model=tr_server.model, messages=[{"role": "user", "content": "Paris?"}], response_format=City
    )
    assert isinstance(reply.choices[0].message.parsed, City)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_whole_and_streamed(tr_server, choice):
    client = api(tr_server)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.chat.completions.create(
        model=tr_server.model, messages=messages, tools=[WEATHER], tool_choice=choice
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    weather_call(reply.choices[0].message.tool_calls[0])
    calls: dict = {}
    reason = None
    for chunk in client.chat.completions.create(
        model=tr_server.model, messages=messages, tools=[WEATHER], tool_choice=choice, stream=True
    ):
        for piece in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            call = calls.setdefault(piece.index, {"name": None, "arguments": ""})
            call["name"] = piece.function.name or call["name"]
            call["arguments"] += piece.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            reason = chunk.choices[0].finish_reason
    assert reason == "tool_calls" and calls[0]["name"] == "get_weather"
    assert set(json.loads(calls[0]["arguments"])) == {"city"}


def test_auto_is_a_call_or_text_and_a_result_goes_back(tr_server):
    client = api(tr_server)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    forced = client.chat.completions.create(
        model=tr_server.model, messages=messages, tools=[WEATHER], tool_choice="required"
    )
    call = forced.choices[0].message.tool_calls[0]
    messages += [forced.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    reply = client.chat.completions.create(model=tr_server.model, messages=messages, tools=[WEATHER])
    choice = reply.choices[0]
    if choice.message.tool_calls:
        weather_call(choice.message.tool_calls[0])
    else:
        assert isinstance(choice.message.content, str) and not choice.message.content.startswith('{"tool_call"')
