"""Tool formats: which one a chat template speaks, how the tools and the history reach the model,
which replies the grammar allows, and how replies are read back as calls."""

from __future__ import annotations

import json

import pytest

from tr_cli.core.constraint import ConstraintError
from tr_cli.text.grammar import GrammarCompiler, GrammarError
from tr_cli.text.tools import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    Tool,
    ToolChoice,
    parameter_grammars,
    tool_format,
)

from tiny_models import EOS, VOCAB, tiny_tokenizer

WEATHER = Tool(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    strict=True,
)
TIME = Tool("get_time", "The time.", {"type": "object", "properties": {}}, strict=True)
TOOLS = [WEATHER, TIME]


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(tiny_tokenizer(), VOCAB, [EOS])


def follows(compiler, grammar, text: str) -> bool:
    """Whether the grammar allows `text` whole, then the end of the reply."""
    constraint = compiler.constraint(grammar)
    try:
        for token in tiny_tokenizer().encode(text):
            constraint.advance(token)
    except ConstraintError:
        return False
    return constraint.allows(EOS)


def test_the_template_says_which_format():
    assert isinstance(tool_format("{% for m in messages %}{{ m.content }}{% endfor %}"), GenericFormat)
    assert isinstance(tool_format(None), GenericFormat)
    assert isinstance(tool_format("{% if tools %}<tool_call>{% endif %}"), HermesFormat)
    assert isinstance(tool_format("{%- if tools is not none %}{{ tools | tojson }}{% endif %}"), Llama3Format)


def test_generic_grammar_allows_calls_that_match_and_answers_only_in_auto(compiler):
    call = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}}'
    answer = '{"response": "It is sunny."}'
    auto = GenericFormat().grammar(TOOLS, ToolChoice("auto"))
    assert follows(compiler, auto, call) and follows(compiler, auto, answer)
    assert not follows(compiler, auto, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}')
    assert not follows(compiler, auto, '{"tool_call": {"name": "get_news", "arguments": {}}}')
    required = GenericFormat().grammar(TOOLS, ToolChoice("required"))
    assert follows(compiler, required, call) and not follows(compiler, required, answer)
    named = GenericFormat().grammar(TOOLS, ToolChoice("function", "get_time"))
    assert follows(compiler, named, '{"tool_call": {"name": "get_time", "arguments": {}}}')
    assert not follows(compiler, named, call)
    assert GenericFormat().grammar(TOOLS, ToolChoice("none")) is None


def test_hermes_grammar_forces_one_tagged_call(compiler):
    grammar = HermesFormat().grammar(TOOLS, ToolChoice("required"))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "f"}}\n</tool_call>'
    assert follows(compiler, grammar, call)
    assert not follows(compiler, grammar, "It is sunny.")
    assert HermesFormat().grammar(TOOLS, ToolChoice("auto")) is None  # free text, calls read out of it


def test_llama3_grammar_forces_a_call_object(compiler):
    grammar = Llama3Format().grammar(TOOLS, ToolChoice("function", "get_weather"))
    assert follows(compiler, grammar, '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}')
    assert not follows(compiler, grammar, '{"name": "get_time", "parameters": {}}')


def test_replies_are_read_back_as_calls_or_content():
    content, calls = GenericFormat().parse('{"tool_call": {"name": "get_time", "arguments": {}}}', TOOLS)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {})]
    assert GenericFormat().parse('{"response": "Hi"}', TOOLS) == ("Hi", [])
    assert GenericFormat().parse('{"tool_call": {"na', TOOLS) == ('{"tool_call": {"na', [])  # cut short
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    )
    text += '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    content, calls = HermesFormat().parse(text, TOOLS)
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather", "get_time"]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    assert HermesFormat().parse("<tool_call>\nnot json\n</tool_call>", TOOLS)[1] == []
    content, calls = Llama3Format().parse('{"name": "get_weather", "parameters": {"city": "Rome", "unit": "c"}}', TOOLS)
    assert content is None and json.loads(calls[0].arguments) == {"city": "Rome", "unit": "c"}
    assert Llama3Format().parse('{"name": "unknown", "parameters": {}}', TOOLS)[1] == []


def test_generic_history_describes_the_tools_and_writes_calls_and_results_as_json():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Noon."},
        {"role": "user", "content": "Thanks"},
    ]
    out = GenericFormat().prepare(messages, TOOLS, ToolChoice("auto"))
    assert (
        out[0]["role"] == "system"
        and out[0]["content"].startswith("Be brief.\n\n")
        and "get_weather" in out[0]["content"]
    )
    assert json.loads(out[2]["content"]) == {"tool_call": {"name": "get_time", "arguments": {}}}
    assert out[3] == {
        "role": "user",
        "content": json.dumps({"tool_response": {"name": "get_time", "content": "12:00"}}),
    }
    assert json.loads(out[4]["content"]) == {"response": "Noon."}
    assert all(set(m) == {"role", "content"} for m in out)
    plain = GenericFormat().prepare(messages, TOOLS, ToolChoice("none"))
    assert plain[0] == {"role": "system", "content": "Be brief."} and plain[4]["content"] == "Noon."


def test_native_history_keeps_calls_as_objects_for_the_template():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "5 C", "tool_call_id": "call_1"},
    ]
    out = HermesFormat().prepare(messages, TOOLS, ToolChoice("auto"))
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert out[1]["name"] == "get_weather"


def test_tool_schemas_are_checked_one_by_one():
    bad = Tool("bad", "", {"type": "object", "properties": {"x": {"type": "strin"}}}, strict=True)
    (weather,) = parameter_grammars([WEATHER])
    GrammarCompiler(tiny_tokenizer(), VOCAB, [EOS]).check(weather)
    with pytest.raises(GrammarError, match=r"^tools\[1\]\.function\.parameters: .*strin"):
        parameter_grammars([WEATHER, bad])
    with pytest.raises(GrammarError, match="names two tools"):
        parameter_grammars([WEATHER, WEATHER])
    # A bad pattern names its fault (the first line of llguidance's report said only "regex parse error:").
    pattern = Tool("p", "", {"type": "object", "properties": {"x": {"type": "string", "pattern": "[a-"}}}, strict=True)
    with pytest.raises(GrammarError, match=r"regex parse error in '\[a-': unclosed character class$"):
        parameter_grammars([pattern])


def test_parameters_with_their_own_definitions_keep_them_inside_the_wrapper(compiler):
    """Pydantic writes nested models as $defs with local $refs (and a tree refers to itself):
    embedded in the call grammar they must still resolve."""
    place = {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/Point"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["at", "next"],
        "additionalProperties": False,
    }
    tools = [Tool("move", "", place, strict=True), WEATHER]
    for fmt, text in (
        (
            GenericFormat(),
            '{"tool_call": {"name": "move", "arguments": {"at": {"x": 1}, "next": {"at": {"x": 2}, "next": null}}}}',
        ),
        (HermesFormat(), '<tool_call>\n{"name": "move", "arguments": {"at": {"x": 1}, "next": null}}\n</tool_call>'),
        (Llama3Format(), '{"name": "move", "parameters": {"at": {"x": 1}, "next": null}}'),
    ):
        grammar = fmt.grammar(tools, ToolChoice("required"))
        assert follows(compiler, grammar, text), fmt.name
        assert not follows(compiler, grammar, text.replace('{"x": 1}', '{"y": 1}')), fmt.name


def test_a_call_cut_by_max_tokens_reads_as_the_call_so_far_never_the_wrapper():
    generic = GenericFormat()
    content, (call,) = generic.parse_cut('{"tool_call": {"name": "get_weather", "arguments": {"city": "Par', TOOLS)
    assert content is None and call.name == "get_weather" and call.arguments == '{"city": "Par'
    assert generic.parse_cut('{"tool_call": {"name": "get_wea', TOOLS) == (None, [])
    assert generic.parse_cut('{"tool_', TOOLS) == (None, [])
    assert generic.parse_cut('{"response": "It is sunny \\u00', TOOLS) == ("It is sunny ", [])
    assert generic.parse_cut('{"response": "Line\\nnext', TOOLS) == ("Line\nnext", [])
    hermes = HermesFormat()
    content, (call,) = hermes.parse_cut('<tool_call>\n{"name": "get_time", "arguments": {', TOOLS)
    assert content is None and (call.name, call.arguments) == ("get_time", "{")
    assert hermes.parse_cut("Just text", TOOLS) == ("Just text", [])
    (call,) = Llama3Format().parse_cut('{"name": "get_time", "parameters": {"x', TOOLS)[1]
    assert (call.name, call.arguments) == ("get_time", '{"x')


@pytest.mark.parametrize("fmt", [GenericFormat(), HermesFormat(), Llama3Format()], ids=lambda fmt: fmt.name)
def test_a_cut_calls_arguments_are_a_prefix_of_what_the_whole_call_says(fmt):
    """Cut anywhere after the name: the arguments are a prefix of the whole call's arguments text
    (empty while the key before them is cut; never the key's pieces, nor the `}` or tag after them)."""
    arguments = '{"city": "Paris"}'
    field = "parameters" if isinstance(fmt, Llama3Format) else "arguments"
    call = f'{{"name": "get_weather", "{field}": {arguments}}}'
    whole = {
        "generic": f'{{"tool_call": {call}}}',
        "hermes": f"<tool_call>\n{call}\n</tool_call>",
        "llama3": call,
    }[fmt.name]
    start = whole.index('"get_weather"') + len('"get_weather"')
    for end in range(start, len(whole)):
        content, calls = fmt.parse_cut(whole[:end], TOOLS)
        assert content is None and [c.name for c in calls] == ["get_weather"], whole[:end]
        assert arguments.startswith(calls[0].arguments), (whole[:end], calls[0].arguments)
        if end >= whole.index(arguments) + len(arguments):
            assert calls[0].arguments == arguments, whole[:end]


def test_a_character_cut_in_its_bytes_is_not_part_of_a_cut_calls_arguments():
    """The tokens of a character cut by max_tokens decode to U+FFFD: not what the model wrote."""
    cut = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Helsinki \ufffd'
    assert GenericFormat().parse_cut(cut, TOOLS)[1][0].arguments == '{"city": "Helsinki '


def test_a_cut_answer_with_a_name_field_is_no_call():
    """An answer held to response_format whose first field is "name" (Llama 3's calls look alike)."""
    text = '{"name": "Paris", "population": 21'
    assert Llama3Format().parse_cut(text, TOOLS) == (text, [])
    assert Llama3Format().parse_cut('{"name": "get_weather", "other": 1', TOOLS)[1] == []
