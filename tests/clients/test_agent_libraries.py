"""Agent and structured-output libraries as their docs connect them to an OpenAI-compatible
server: openai-agents, pydantic-ai, langchain-openai, instructor, smolagents. Each call must come
back as a parsed tool call or schema-valid output (the protocol; the tiny model's answers mean
nothing)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from client_server import MAX_TOKENS, needs

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int


def city_weather(city: Annotated[str, Field(max_length=20)]) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


# --- openai-agents ------------------------------------------------------------------------


def _agents_model(tr_server):
    agents = needs("agents")
    openai = needs("openai")
    client = openai.AsyncOpenAI(base_url=tr_server.base_url, api_key="unused", max_retries=0)
    agents.set_tracing_disabled(True)
    return agents, agents.OpenAIChatCompletionsModel(model=tr_server.model, openai_client=client)


def test_openai_agents_calls_a_function_tool_when_required(tr_server):
    agents, model = _agents_model(tr_server)
    called = []

    @agents.function_tool
    def weather(city: Annotated[str, Field(max_length=20)]) -> str:
        """The weather in a city."""
        called.append(city)
        return "sunny"

    agent = agents.Agent(
        name="w",
        instructions="Use the tool.",
        model=model,
        tools=[weather],
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS),
    )
    result = asyncio.run(agents.Runner.run(agent, "Weather in Paris?", max_turns=3))
    assert called and all(isinstance(city, str) for city in called)
    assert isinstance(result.final_output, str)


def test_openai_agents_output_type_with_tools(tr_server):
    agents, model = _agents_model(tr_server)
    agent = agents.Agent(
        name="c",
        model=model,
        tools=[agents.function_tool(city_weather)],
        output_type=City,
        model_settings=agents.ModelSettings(max_tokens=MAX_TOKENS),
    )
    result = asyncio.run(agents.Runner.run(agent, "Tell me about Paris.", max_turns=4))
    assert isinstance(result.final_output, City)


# --- pydantic-ai ---------------------------------------------------------------------------


def _pydantic_ai_model(tr_server):
    needs("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(tr_server.model, provider=OpenAIProvider(base_url=tr_server.base_url, api_key="unused"))


def test_pydantic_ai_output_type(tr_server):
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(tr_server), output_type=City, retries=0)
    assert isinstance(agent.run_sync("Tell me about Paris.").output, City)


def test_pydantic_ai_tool_agent(tr_server):
    """Its tool calls are parsed and run (the tiny model may call the tool until the request limit)."""
    from pydantic_ai import Agent, capture_run_messages
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import ToolCallPart, ToolReturnPart
    from pydantic_ai.usage import UsageLimits

    agent = Agent(_pydantic_ai_model(tr_server), output_type=City, tools=[city_weather], retries=0)
    with capture_run_messages() as messages:
        try:
            result = agent.run_sync("Weather in Paris, then the city.", usage_limits=UsageLimits(request_limit=3))
        except UsageLimitExceeded:
            result = None
    parts = [part for message in messages for part in message.parts]
    calls = [part for part in parts if isinstance(part, ToolCallPart)]
    assert calls and all(set(call.args_as_dict()) <= {"city", "name", "population"} for call in calls)
    if result is not None:
        assert isinstance(result.output, City)
    else:
        assert any(isinstance(part, ToolReturnPart) and part.tool_name == "city_weather" for part in parts)


# --- langchain-openai ---------------------------------------------------------------------


def _chat_openai(tr_server):
    needs("langchain_openai")
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=tr_server.model, base_url=tr_server.base_url, api_key="unused", max_tokens=MAX_TOKENS, max_retries=0
    )


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_with_structured_output(tr_server, method):
    structured = _chat_openai(tr_server).with_structured_output(City, method=method)
    assert isinstance(structured.invoke("Tell me about Paris."), City)


def test_langchain_bind_tools_and_a_tool_message(tr_server):
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = _chat_openai(tr_server)
    forced = llm.bind_tools([city_weather], tool_choice="city_weather")
    messages = [HumanMessage("Weather in Paris?")]
    reply = forced.invoke(messages)
    (call,) = reply.tool_calls
    assert call["name"] == "city_weather" and set(call["args"]) == {"city"}
    messages += [reply, ToolMessage(city_weather(**call["args"]), tool_call_id=call["id"])]
    answer = llm.bind_tools([city_weather]).invoke(messages)
    assert answer.tool_calls or isinstance(answer.content, str)


# --- instructor ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes(tr_server, mode):
    instructor = needs("instructor")
    openai = needs("openai")
    client = instructor.from_openai(
        openai.OpenAI(base_url=tr_server.base_url, api_key="unused", max_retries=0), mode=getattr(instructor.Mode, mode)
    )
    city = client.chat.completions.create(
        model=tr_server.model,
        response_model=City,
        messages=[{"role": "user", "content": "Tell me about Paris."}],
        max_retries=0,
        max_tokens=MAX_TOKENS,
    )
    assert isinstance(city, City)


# --- smolagents ----------------------------------------------------------------------------


def test_smolagents_tool_calling_agent(tr_server):
    needs("smolagents")
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    from smolagents.memory import ActionStep
    from smolagents.utils import AgentMaxStepsError

    @tool
    def weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        return "sunny"

    model = OpenAIServerModel(
        model_id=tr_server.model, api_base=tr_server.base_url, api_key="unused", max_tokens=MAX_TOKENS
    )
    agent = ToolCallingAgent(tools=[weather], model=model, max_steps=2, verbosity_level=0)
    agent.run("Weather in Paris?")
    steps = [step for step in agent.memory.steps if isinstance(step, ActionStep)]
    # After max_steps smolagents asks once more for a plain answer (no tools): not a call to check.
    steps = [step for step in steps if not isinstance(step.error, AgentMaxStepsError)]
    assert steps and all(step.tool_calls for step in steps), [step.error for step in steps]
    assert all(call.name in ("weather", "final_answer") for step in steps for call in step.tool_calls)
