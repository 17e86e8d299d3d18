"""Tool calls: how the tools reach the model, which grammar its reply follows, and how the reply
is read back as calls, in the format the model's chat template speaks.

- Hermes/Qwen (the template writes `<tool_call>`): the tools go through the template
  (`apply_chat_template(tools=...)`); a call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
  </tool_call>`.
- Llama 3 (the template takes `tools` without `<tool_call>`): also through the template; a call is
  the JSON object `{"name": ..., "parameters": {...}}`.
- Generic (a template with no tool support, SmolLM2's among them; what llama.cpp's generic handler
  does): the tools are described in the system message and the whole reply is one JSON object,
  `{"tool_call": {"name": ..., "arguments": {...}}}` or `{"response": "..."}`, held to that by the
  grammar.

`tool_choice` "required" or a named function makes the grammar allow exactly one call (of that
function); "auto" lets the model answer or call (the generic grammar allows both; the native
formats decode free and read calls out of the text); "none" offers no tools. A call's arguments
always follow the function's parameter schema where the grammar holds them.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .grammar import JSON_LAYOUT, Grammar, GrammarError
from .schema_defaults import STRICT, SchemaReading

Message = dict[str, Any]
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}  # a function without parameters


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    strict: bool = False
    reading: SchemaReading = STRICT  # what the parameter schema leaves unsaid (text/schema_defaults.py)

    @property
    def held_to(self) -> dict:
        """The parameter schema the grammar holds the arguments to."""
        return self.reading.apply(self.parameters)

    def as_template(self) -> dict:
        """The OpenAI shape chat templates take as `tools`."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the arguments' JSON text, as the API carries them


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolChoice:
    """ "auto", "required", "none", or one function by name."""

    mode: str
    function: str | None = None

    @property
    def offers(self) -> bool:
        return self.mode != "none"

    @property
    def forces_call(self) -> bool:
        return self.mode in ("required", "function")

    def callable(self, tools: list[Tool]) -> list[Tool]:
        return [tool for tool in tools if self.function is None or tool.name == self.function]


def parameter_grammars(tools: list[Tool]) -> list[Grammar]:
    """Each tool's parameter schema as a grammar of its own, so that a compiler's check names the
    tool whose schema cannot be used; GrammarError for a repeated name or a schema refused here."""
    seen: set[str] = set()
    grammars = []
    for index, tool in enumerate(tools):
        if tool.name in seen:
            raise GrammarError(f"tools[{index}].function.name: '{tool.name}' names two tools")
        seen.add(tool.name)
        grammars.append(Grammar.json_schema(tool.held_to, tool.strict, f"tools[{index}].function.parameters"))
    return grammars


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _arguments_value(text: str) -> Any:
    """A call's arguments as the template renders them (an object), from the API's JSON text."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _embedded(schema: dict, tag: str, defs: dict) -> dict:
    """A tool's parameter schema as it can sit inside a wrapper schema: its local `$ref`s would
    point at the wrapper's root there, so a schema that has them moves into the wrapper's `$defs`
    (itself under `tag`, its own definitions under `tag.NAME`) and is referred to."""
    if '"$ref"' not in json.dumps(schema):
        return schema

    def moved(ref: str) -> str:
        pointer = ref[1:]
        for key in ("/$defs/", "/definitions/"):
            if pointer.startswith(key):
                name, slash, rest = pointer[len(key) :].partition("/")
                return f"#/$defs/{tag}.{name}{slash}{rest}"
        return f"#/$defs/{tag}{pointer}"

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: rewrite(value) for key, value in node.items()}
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            out["$ref"] = moved(node["$ref"])
        return out

    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            for name, definition in schema[key].items():
                defs[f"{tag}.{name}"] = rewrite(definition)
    defs[tag] = rewrite({key: value for key, value in schema.items() if key not in ("$defs", "definitions")})
    return {"$ref": f"#/$defs/{tag}"}


def _calls_schema(
    tools: list[Tool],
    call: Callable[[str, dict], dict],
    extra: list[dict],
    answer: dict | None = None,
    wrap: Callable[[dict], dict] = lambda schema: schema,
) -> dict:
    """anyOf the calls `call(name, parameters)` builds for `tools` (and the `extra` options, and
    the `answer` schema as `wrap` wraps it), each schema embedded with its definitions."""
    defs: dict = {}
    options = [call(tool.name, _embedded(tool.held_to, f"tool{i}", defs)) for i, tool in enumerate(tools)]
    if answer is not None:
        options.append(wrap(_embedded(answer, "answer", defs)))
    schema: dict = {"anyOf": options + extra}
    if defs:
        schema["$defs"] = defs
    return schema


def _with_layout(schema: dict, strict: bool) -> dict:
    """A schema for a grammar's %json rule, with tr's JSON layout (grammar.JSON_LAYOUT)."""
    return {**schema, "x-guidance": {**JSON_LAYOUT, "lenient": not strict}}


class ToolFormat(ABC):
    """How one family of chat templates speaks tools."""

    name = "generic"
    native = False  # the template renders the tools itself

    @abstractmethod
    def prepare(self, messages: list[Message], tools: list[Tool], choice: ToolChoice) -> list[Message]:
        """The conversation as the template gets it (tools described, calls and results written)."""

    @abstractmethod
    def grammar(self, tools: list[Tool], choice: ToolChoice, answer: dict | None = None) -> Grammar | None:
        """What the reply is held to (None: free text, calls read out of it). `answer`: the
        schema of a reply that calls nothing (response_format beside tools), when there is one."""

    @abstractmethod
    def parse(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        """The reply's content (None when it is only calls) and its calls."""

    def parse_cut(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        """A reply cut short (max_tokens): what a client can read of it, as OpenAI returns a cut
        call (the name, and the arguments' JSON text as far as it got). Default: the text."""
        return self.parse(text, tools)


_CUT_CALL = re.compile(r'\s*\{"name": "((?:[^"\\]|\\.)*)"(.*)', re.DOTALL)
_ARGUMENTS_KEYS = (', "arguments": ', ', "parameters": ')


def _cut_call(text: str, tools: list[Tool]) -> list[ToolCall]:
    """The call a cut `{"name": ..., "arguments": ...` begins; none before its name is whole (nor
    one whose name is no tool's, nor text shaped otherwise: an answer with a "name" field). Its
    arguments are their JSON text as far as it got: empty while the cut is inside the key before
    them, without a character whose bytes were cut, and without what follows them once they are
    whole (the call's `}`, a closing tag)."""
    match = _CUT_CALL.match(text)
    try:
        name = json.loads(f'"{match[1]}"') if match else None
    except ValueError:
        return []
    if name not in {tool.name for tool in tools}:
        return []
    rest = match[2]
    for key in _ARGUMENTS_KEYS:
        if key.startswith(rest):
            return [ToolCall(new_call_id(), name, "")]
        if rest.startswith(key):
            arguments = rest[len(key) :]
            try:
                end = json.JSONDecoder().raw_decode(arguments)[1]
            except ValueError:  # cut inside them; a character cut in its bytes decodes as U+FFFD: not yet written
                end = len(arguments.rstrip("\ufffd"))
            return [ToolCall(new_call_id(), name, arguments[:end])]
    return []


def _only(key: str, value: dict) -> dict:
    """An object with one required property."""
    return {"type": "object", "properties": {key: value}, "required": [key], "additionalProperties": False}


def _call(name: str, field: str, parameters: dict) -> dict:
    """A call object: the function's name (a constant) and its arguments under `field`."""
    properties = {"name": {"const": name}, field: parameters}
    return {"type": "object", "properties": properties, "required": ["name", field], "additionalProperties": False}


def _call_names(messages: list[Message]) -> dict[str, str]:
    """Tool call ids of the conversation's assistant messages -> function names."""
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            names[call["id"]] = call["function"]["name"]
    return names


class GenericFormat(ToolFormat):
    name = "generic"

    def prepare(self, messages: list[Message], tools: list[Tool], choice: ToolChoice) -> list[Message]:
        names = _call_names(messages)
        out: list[Message] = []
        for message in messages:
            role = message["role"]
            if role == "assistant" and message.get("tool_calls"):
                calls = [
                    {
                        "tool_call": {
                            "name": c["function"]["name"],
                            "arguments": _arguments_value(c["function"]["arguments"]),
                        }
                    }
                    for c in message["tool_calls"]
                ]
                out.append(
                    {"role": "assistant", "content": "\n".join(json.dumps(c, ensure_ascii=False) for c in calls)}
                )
            elif role == "assistant" and choice.offers:
                out.append(
                    {"role": "assistant", "content": json.dumps({"response": message["content"]}, ensure_ascii=False)}
                )
            elif role == "tool":
                result = {
                    "tool_response": {
                        "name": names.get(message.get("tool_call_id", ""), ""),
                        "content": message["content"],
                    }
                }
                out.append({"role": "user", "content": json.dumps(result, ensure_ascii=False)})
            else:
                out.append({"role": role, "content": message["content"]})
        if not choice.offers:
            return out
        described = "\n".join(json.dumps(tool.as_template()["function"], ensure_ascii=False) for tool in tools)
        how = 'To call a tool, reply with one JSON object {"tool_call": {"name": <tool name>, "arguments": {...}}}'
        how += "." if choice.forces_call else '; to answer directly, reply with {"response": "<your answer>"}.'
        text = f"You can call these tools (their arguments as JSON Schema):\n{described}\n\n{how}"
        if out and out[0]["role"] == "system":
            return [{"role": "system", "content": f"{out[0]['content']}\n\n{text}"}, *out[1:]]
        return [{"role": "system", "content": text}, *out]

    def grammar(self, tools: list[Tool], choice: ToolChoice, answer: dict | None = None) -> Grammar | None:
        if not choice.offers:
            return None
        extra = []
        if not choice.forces_call and answer is None:
            extra.append(_only("response", {"type": "string"}))
        schema = _calls_schema(
            choice.callable(tools),
            lambda name, parameters: _only("tool_call", _call(name, "arguments", parameters)),
            extra,
            None if choice.forces_call else answer,
            lambda schema: _only("response", schema),
        )
        return Grammar.json_schema(schema, strict=all(tool.strict for tool in tools), name="tools")

    def parse(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        try:
            value = json.loads(text)
        except ValueError:
            return text, []  # cut short (max_tokens): what was written
        if isinstance(value, dict) and isinstance(value.get("tool_call"), dict):
            call = value["tool_call"]
            return None, [ToolCall(new_call_id(), str(call.get("name")), _arguments_text(call.get("arguments", {})))]
        if isinstance(value, dict) and isinstance(value.get("response"), str):
            return value["response"], []
        if isinstance(value, dict) and set(value) == {"response"}:  # an answer held to response_format
            return json.dumps(value["response"], ensure_ascii=False), []
        return text, []

    def parse_cut(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        stripped = text.lstrip()
        if stripped.startswith('{"tool_call": '):
            return None, _cut_call(stripped[len('{"tool_call": ') :], tools)
        if stripped.startswith('{"response": "'):
            return _partial_string(stripped[len('{"response": "') :]), []
        if stripped.startswith("{"):
            return None, []  # cut before the wrapper said which: nothing a client can read
        return self.parse(text, tools)


def _partial_string(body: str) -> str:
    """The text of a JSON string cut short (its opening quote gone): as much as decodes."""
    for end in range(len(body), max(len(body) - 12, -1), -1):  # an escape cut in half: drop it
        try:
            return json.loads(f'"{body[:end]}"')
        except ValueError:
            continue
    return body


def _bare_call(text: str, tools: list[Tool]) -> bool:
    """Whether `text` is one call object alone (not an answer that has a "name" field)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    names = {tool.name for tool in tools}
    return isinstance(value, dict) and value.get("name") in names and set(value) <= {"name", "arguments"}


def _native_messages(messages: list[Message]) -> list[Message]:
    """Calls and results in the shape transformers' chat templates read (arguments as objects)."""
    names = _call_names(messages)
    out: list[Message] = []
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": _arguments_value(call["function"]["arguments"]),
                    },
                }
                for call in message["tool_calls"]
            ]
            out.append({"role": "assistant", "content": message.get("content") or "", "tool_calls": calls})
        elif message["role"] == "tool":
            call_id = message.get("tool_call_id", "")
            out.append(
                {"role": "tool", "content": message["content"], "tool_call_id": call_id, "name": names.get(call_id, "")}
            )
        else:
            out.append(message)
    return out


class HermesFormat(ToolFormat):
    """`tag_tokens`: the ids of `<tool_call>` and `</tool_call>` where the tokenizer has them as
    single added tokens (Qwen2.5's 151657 and 151658): the model writes that one token, never the
    characters, so the grammar names the token (llguidance's `<[id]>`); without them, the text."""

    name = "hermes"
    native = True
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def __init__(self, tag_tokens: tuple[int, int] | None = None) -> None:
        self.tag_tokens = tag_tokens

    def prepare(self, messages: list[Message], tools: list[Tool], choice: ToolChoice) -> list[Message]:
        return _native_messages(messages)

    def grammar(self, tools: list[Tool], choice: ToolChoice, answer: dict | None = None) -> Grammar | None:
        if not choice.forces_call and answer is None:
            return None  # "auto": the model writes text or calls; calls are read out of it
        strict = all(tool.strict for tool in tools)
        schema = _calls_schema(
            choice.callable(tools), lambda name, parameters: _call(name, "arguments", parameters), []
        )
        schema = _with_layout(schema, strict)
        if self.tag_tokens is not None:
            opening, closing = (f"<[{token}]>" for token in self.tag_tokens)
        else:
            opening, closing = '"<tool_call>"', '"</tool_call>"'
        calls = f'calls: {opening} "\\n" call "\\n" {closing}\ncall: %json {json.dumps(schema)}'
        if choice.forces_call:
            return Grammar.lark(f"start: calls\n{calls}", "tools")
        # "auto" with response_format: a call, or the answer the format asks for
        answer_rule = f"answer: %json {json.dumps(_with_layout(answer, strict))}"
        return Grammar.lark(f"start: calls | answer\n{calls}\n{answer_rule}", "tools")

    def parse(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        calls = []
        blocks = self._BLOCK.findall(text)
        if not blocks and _bare_call(text, tools):
            blocks = [text.strip()]  # tags the tokenizer decodes to nothing (special tokens): the call alone
        for block in blocks:
            try:
                value = json.loads(block)
            except ValueError:
                return text, []  # not a call after all: the text as written
            if not isinstance(value, dict) or "name" not in value:
                return text, []
            calls.append(ToolCall(new_call_id(), str(value["name"]), _arguments_text(value.get("arguments", {}))))
        if not calls:
            return text, []
        rest = self._BLOCK.sub("", text).strip() if self._BLOCK.search(text) else ""
        return rest or None, calls

    def parse_cut(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        whole, _, cut = text.rpartition("<tool_call>")
        if not _ or "</tool_call>" in cut:
            return self.parse(text, tools)
        content, calls = self.parse(whole, tools) if whole.strip() else (None, [])
        return content, calls + _cut_call(cut, tools)


class Llama3Format(ToolFormat):
    name = "llama3"
    native = True

    def prepare(self, messages: list[Message], tools: list[Tool], choice: ToolChoice) -> list[Message]:
        return _native_messages(messages)

    def grammar(self, tools: list[Tool], choice: ToolChoice, answer: dict | None = None) -> Grammar | None:
        if not choice.forces_call and answer is None:
            return None
        schema = _calls_schema(
            choice.callable(tools),
            lambda name, parameters: _call(name, "parameters", parameters),
            [],
            None if choice.forces_call else answer,
        )
        return Grammar.json_schema(schema, strict=all(tool.strict for tool in tools), name="tools")

    def parse(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        stripped = text.strip()
        if stripped.startswith("<|python_tag|>"):
            stripped = stripped[len("<|python_tag|>") :].strip()
        try:
            value = json.loads(stripped)
        except ValueError:
            return text, []
        names = {tool.name for tool in tools}
        if isinstance(value, dict) and value.get("name") in names:
            arguments = value.get("parameters", value.get("arguments", {}))
            return None, [ToolCall(new_call_id(), value["name"], _arguments_text(arguments))]
        return text, []

    def parse_cut(self, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
        calls = _cut_call(text, tools)
        return (None, calls) if calls else self.parse(text, tools)


def tool_format(chat_template: str | None, added_tokens: Mapping[str, int] | None = None) -> ToolFormat:
    """The format a chat template speaks: Hermes/Qwen if it writes `<tool_call>`, Llama 3 if it
    takes `tools` otherwise, else the generic one. `added_tokens`: the tokenizer's added tokens
    (text -> id), where the tool tags may be single tokens."""
    template = chat_template or ""
    if "<tool_call>" in template:
        added = added_tokens or {}
        tags = (added.get("<tool_call>"), added.get("</tool_call>"))
        return HermesFormat(tags if None not in tags else None)
    if re.search(r"\btools\b", template):
        return Llama3Format()
    return GenericFormat()
