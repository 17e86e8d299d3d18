"""What clients send: the OpenAI request bodies tr serve reads, validated by pydantic.

Fields the API has and tr cannot honour are declared so that a request using them is refused
with a clear message (`unsupported`) instead of being answered as if they had been applied.
Fields tr does not know at all are ignored, as most OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.logprobs import MAX_TOP
from ..text.grammar import Grammar, GrammarError
from ..text.input_text import unicode_problem
from ..text.schema_defaults import STRICT, SchemaReading
from ..text.tools import NO_PARAMETERS, Tool, ToolChoice
from .errors import ApiError

MAX_STOP_STRINGS = 4  # the OpenAI API's limit
MAX_STOP_LENGTH = 256


def checked_text(text: str, param: str) -> str:
    """`text`, refused when JSON smuggled in what is not Unicode (a lone surrogate escape)."""
    problem = unicode_problem(text)
    if problem:
        raise ApiError(400, f"{param}: the text holds {problem}", param=param)
    return text


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str


class ToolCallMessage(BaseModel):
    """A call an assistant message made (sent back in the history)."""

    model_config = ConfigDict(extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallMessage] | None = None  # assistant
    tool_call_id: str | None = None  # tool: the call this is the result of

    def text(self, index: int) -> str:
        """The message's text; parts other than text are refused."""
        param = f"messages[{index}].content"
        if self.role == "function":
            raise ApiError(400, f"messages[{index}]: role 'function' is not supported (use tools)", param=param)
        if self.content is None and self.role == "assistant" and self.tool_calls:
            return ""
        if self.content is None:
            raise ApiError(400, f"messages[{index}]: content is required", param=param)
        if isinstance(self.content, str):
            return checked_text(self.content, param)
        pieces = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ApiError(400, f"{param}: only text parts are supported, got '{part.type}'", param=param)
            pieces.append(part.text)
        return checked_text("".join(pieces), param)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "response"
    description: str | None = None
    schema_: Any = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's shapes: {"type": "text"}, {"type": "json_object"} (any JSON object) and
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def grammar(self, reading: SchemaReading = STRICT) -> Grammar | None:
        """The grammar replies must match; None for plain text. A schema that cannot be used is
        refused here (400), before the request queues. `strict: true` refuses keywords that
        cannot be enforced; without it they are ignored and the rest of the schema holds.
        `reading`: what the schema leaves unsaid (text/schema_defaults.py)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Grammar.json_object()
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise ApiError(400, "response_format: type json_schema needs json_schema.schema", param="response_format")
        try:
            return Grammar.json_schema(
                reading.apply(self.json_schema.schema_),
                strict=bool(self.json_schema.strict),
                name="response_format.json_schema.schema",
            )
        except GrammarError as exc:
            raise ApiError(400, str(exc), param="response_format") from None

    def answer_schema(self, reading: SchemaReading = STRICT) -> dict | None:
        """The schema of a reply that calls no tool (response_format beside tools), checked as
        `grammar` checks it; None for plain text."""
        if self.type == "text":
            return None
        self.grammar(reading)  # a schema that cannot be used is refused as without tools
        if self.type == "json_object":
            return {"type": "object"}
        schema = self.json_schema.schema_
        return reading.apply({} if schema is True else schema)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class TrOptions(BaseModel):
    """tr's own request extension, `"tr": {...}`: `steps` streams each decoding step's drafts
    (serve/draft_steps.py) in the chunks' `tr.step`; OpenAI clients that leave it out see nothing new."""

    model_config = ConfigDict(extra="ignore")
    steps: bool = False


class GenerationRequest(BaseModel):
    """The fields /v1/chat/completions and /v1/completions share."""

    # Python's json reads NaN and Infinity: refuse them in every number field before range checks.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**64)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1)] | None = 1  # null: the default (the spec marks both nullable)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # tr's own sampling knobs (what `tr chat` offers; vLLM and llama.cpp accept the same names).
    top_k: Annotated[int, Field(ge=0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    response_format: ResponseFormat | None = None
    tr: TrOptions | None = None
    # tr's: JSON Schema's own reading of schemas (objects open, values unbounded; docs/server.md).
    open_schemas: bool | None = None
    # Declared so that a request relying on them is refused, not silently answered without them.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ApiError(400, f"stop: at most {MAX_STOP_STRINGS} sequences, got {len(stops)}", param="stop")
        if any(len(s) > MAX_STOP_LENGTH for s in stops):
            raise ApiError(400, f"stop: sequences of at most {MAX_STOP_LENGTH} characters", param="stop")
        return tuple(checked_text(s, "stop") for s in stops if s)

    def grammar(self, reading: SchemaReading = STRICT) -> Grammar | None:
        return self.response_format.grammar(reading) if self.response_format is not None else None

    def wants_steps(self) -> bool:
        """Whether the stream carries the draft steps (a whole response never does)."""
        return bool(self.stream and self.tr is not None and self.tr.steps)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> None:
        """Refuse what tr cannot do (one decode at a time, exact distributions only)."""
        if self.n not in (None, 1):
            raise ApiError(400, f"n: only 1 choice per request is supported, got {self.n}", param="n")
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of: only 1 is supported", param="best_of")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ApiError(400, f"{name} is not supported (use repetition_penalty)", param=name)
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported", param="logit_bias")


def _object_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A function's parameters: none is an empty argument object; a schema that names no type is
    one of an object (arguments are always an object)."""
    if parameters is None:
        return dict(NO_PARAMETERS)
    return parameters if "type" in parameters else {"type": "object", **parameters}


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP)] | None = None

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprob_top(self) -> int | None:
        """How many most likely tokens to report beside each token's log-probability; None: no
        log-probabilities."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return self.top_logprobs or 0

    def unsupported(self) -> None:
        super().unsupported()
        if self.functions:
            raise ApiError(400, "functions is not supported (use tools)", param="functions")
        offered = self.tool_setup()
        if offered is not None and offered[1].offers:
            if self.logprobs:
                raise ApiError(400, "logprobs together with tools is not supported", param="logprobs")

    def tool_setup(self) -> tuple[list[Tool], ToolChoice] | None:
        """The tools offered and how the model may use them; None without tools."""
        choice = self.tool_choice
        if not self.tools:
            if choice is not None and choice not in ("none", "auto"):
                raise ApiError(400, "tool_choice: a function is asked for but tools is empty", param="tool_choice")
            return None
        tools = [
            Tool(
                t.function.name,
                t.function.description or "",
                _object_schema(t.function.parameters),
                bool(t.function.strict),
            )
            for t in self.tools
        ]
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in {tool.name for tool in tools}:
                raise ApiError(400, f"tool_choice: no tool is named '{choice.function.name}'", param="tool_choice")
            return tools, ToolChoice("function", choice.function.name)
        return tools, ToolChoice(choice or "auto")

    def conversation(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them ('developer' is the system role); an
        assistant's calls and a tool's result keep their ids."""
        messages = []
        for i, m in enumerate(self.messages):
            message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
            if m.tool_calls:
                message["tool_calls"] = [call.model_dump() for call in m.tool_calls]
            if m.role == "tool":
                message["tool_call_id"] = m.tool_call_id or ""
            messages.append(message)
        return messages

    def uses_tools(self) -> bool:
        """Whether tools are offered or the history holds calls or results."""
        return bool(self.tools) or any(m.tool_calls or m.role == "tool" for m in self.messages)


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    # The legacy API's logprobs: how many most likely tokens beside each one (OpenAI allows 5).
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP)] | None = None

    def requested_tokens(self) -> int | None:
        return self.max_tokens

    def logprob_top(self) -> int | None:
        """As the chat request's: here the field itself is the count."""
        return self.logprobs

    def unsupported(self) -> None:
        super().unsupported()
        if self.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if self.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix")

    def prompt_text_or_ids(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise ApiError(400, f"prompt: one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, list) and not prompt:
            raise ApiError(400, "prompt is empty", param="prompt")
        return checked_text(prompt, "prompt") if isinstance(prompt, str) else prompt
