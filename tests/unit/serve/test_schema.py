"""Request validation (tr_cli/serve/schema.py) without a server: what a good request reads as, and
the refusals, each naming the offending field. The same refusals through HTTP (status, error
body, nothing reaching the decoder) are tests/integration/test_serve.py's."""

import pytest
from pydantic import ValidationError

from tr_cli.serve.errors import ApiError
from tr_cli.serve.schema import MAX_STOP_LENGTH, MAX_STOP_STRINGS, ChatCompletionRequest, CompletionRequest

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "tiny", "prompt": "Once upon"}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({**CHAT, **fields})


def text(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({**TEXT, **fields})


def refused(call, param: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status == 400 and caught.value.param == param
    assert caught.value.body()["error"]["param"] == param
    return caught.value


# --- what a good request reads as ---------------------------------------------------------


def test_a_minimal_chat_request_has_the_api_defaults():
    request = chat()
    request.unsupported()  # nothing to refuse
    assert request.conversation() == [{"role": "user", "content": "hi"}]
    assert (request.n, request.stream, request.requested_tokens()) == (1, False, None)
    assert request.stop_strings() == () and not request.include_usage()
    assert request.temperature is request.top_p is request.top_k is request.seed is None


def test_developer_is_the_system_role_and_text_parts_are_joined():
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": "ok"},
    ]
    assert chat(messages=messages).conversation() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one two"},
        {"role": "assistant", "content": "ok"},
    ]


def test_unknown_fields_are_ignored_and_neutral_values_of_unsupported_ones_accepted():
    request = chat(
        frobnicate=True,
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        logprobs=False,
        best_of=1,
        response_format={"type": "text"},
        tools=[],
    )
    request.unsupported()
    assert not hasattr(request, "frobnicate")
    text(echo=False, suffix="", logprobs=0).unsupported()


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=5).requested_tokens() == 5
    assert chat(max_tokens=5, max_completion_tokens=7).requested_tokens() == 7
    assert text(max_tokens=9).requested_tokens() == 9


def test_stop_strings_take_one_or_a_list_and_drop_empty_ones():
    assert chat(stop="\n").stop_strings() == ("\n",)
    assert chat(stop=["END", "", "###"]).stop_strings() == ("END", "###")
    assert chat(stop=["x"] * MAX_STOP_STRINGS).stop_strings() == ("x",) * MAX_STOP_STRINGS
    assert chat(stop="s" * MAX_STOP_LENGTH).stop_strings() == ("s" * MAX_STOP_LENGTH,)


def test_usage_is_streamed_only_when_asked_for_on_a_stream():
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage()
    assert not chat(stream=True, stream_options={"include_usage": False}).include_usage()
    assert not chat(stream=True).include_usage()
    assert not chat(stream=False, stream_options={"include_usage": True}).include_usage()


def test_a_completion_prompt_is_text_a_one_string_list_or_token_ids():
    assert text().prompt_text_or_ids() == "Once upon"
    assert text(prompt=["Once upon"]).prompt_text_or_ids() == "Once upon"
    assert text(prompt=[5, 6, 7]).prompt_text_or_ids() == [5, 6, 7]


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 0), ("temperature", 2), ("top_p", 0), ("top_p", 1), ("seed", 0), ("seed", 2**64 - 1)],
)
def test_range_ends_are_accepted(field, value):
    assert getattr(chat(**{field: value}), field) == value


# --- refusals: values out of range (pydantic) ----------------------------------------------


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"max_tokens": 0}, ("max_tokens",)),
        ({"max_completion_tokens": 0}, ("max_completion_tokens",)),
        ({"temperature": 2.5}, ("temperature",)),
        ({"temperature": -0.1}, ("temperature",)),
        ({"top_p": 1.5}, ("top_p",)),
        ({"top_k": -1}, ("top_k",)),
        ({"repetition_penalty": 0}, ("repetition_penalty",)),
        ({"seed": -1}, ("seed",)),
        ({"seed": 2**64}, ("seed",)),
        ({"n": 0}, ("n",)),
        ({"messages": []}, ("messages",)),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, ("messages", 0, "role")),
    ],
)
def test_out_of_range_values_fail_validation_at_their_field(fields, where):
    with pytest.raises(ValidationError) as caught:
        chat(**fields)
    assert caught.value.errors()[0]["loc"] == where


def test_model_is_required():
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate({"messages": CHAT["messages"]})
    assert caught.value.errors()[0]["loc"] == ("model",)


# --- refusals: what tr cannot honour --------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1.0}, "frequency_penalty"),
        ({"logit_bias": {"42": 5.0}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "logprobs": True}, "logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_chat_refuses_what_tr_cannot_honour(fields, param):
    refused(chat(**fields).unsupported, param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"echo": True}, "echo"), ({"suffix": "The end."}, "suffix"), ({"n": 3}, "n")],
)
def test_completion_refuses_what_tr_cannot_honour(fields, param):
    refused(text(**fields).unsupported, param)


def test_logprobs_read_as_the_count_of_most_likely_tokens():
    assert chat().logprob_top() is None and chat(logprobs=False).logprob_top() is None
    assert chat(logprobs=True).logprob_top() == 0
    assert chat(logprobs=True, top_logprobs=5).logprob_top() == 5
    refused(lambda: chat(top_logprobs=2).logprob_top(), "top_logprobs")  # needs logprobs: true
    assert text().logprob_top() is None and text(logprobs=0).logprob_top() == 0 and text(logprobs=3).logprob_top() == 3
    for bad in ({"top_logprobs": 21, "logprobs": True}, {"top_logprobs": -1, "logprobs": True}):
        with pytest.raises(ValidationError):
            chat(**bad)
    with pytest.raises(ValidationError):
        text(logprobs=21)


def test_penalties_refusal_points_to_repetition_penalty():
    assert "repetition_penalty" in refused(chat(presence_penalty=1.0).unsupported, "presence_penalty").message


def test_legacy_function_messages_are_refused():
    request = chat(messages=[{"role": "user", "content": "hi"}, {"role": "function", "content": "42"}])
    assert "use tools" in refused(request.conversation, "messages[1].content").message


def test_a_message_without_content_or_with_non_text_parts_is_refused():
    refused(chat(messages=[{"role": "user"}]).conversation, "messages[0].content")
    image = [{"type": "text", "text": "see:"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    error = refused(chat(messages=[{"role": "user", "content": image}]).conversation, "messages[0].content")
    assert "image_url" in error.message


def test_text_that_is_not_unicode_is_refused_where_it_is():
    lone = "abc\ud800"  # what a JSON "\ud800" escape decodes to
    refused(
        chat(messages=[{"role": "user", "content": "ok"}, {"role": "user", "content": lone}]).conversation,
        "messages[1].content",
    )
    refused(chat(stop=["fine", lone]).stop_strings, "stop")
    refused(text(prompt=lone).prompt_text_or_ids, "prompt")


def test_too_many_or_too_long_stop_strings_are_refused():
    assert str(MAX_STOP_STRINGS) in refused(chat(stop=["x"] * (MAX_STOP_STRINGS + 1)).stop_strings, "stop").message
    refused(chat(stop=["s" * (MAX_STOP_LENGTH + 1)]).stop_strings, "stop")


def test_a_completion_prompt_of_several_strings_or_none_is_refused():
    assert "2" in refused(text(prompt=["a", "b"]).prompt_text_or_ids, "prompt").message
    refused(text(prompt=[]).prompt_text_or_ids, "prompt")


def test_response_format_reads_as_a_grammar():
    assert chat().grammar() is None and chat(response_format={"type": "text"}).grammar() is None
    assert "JSON object" == chat(response_format={"type": "json_object"}).grammar().description
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for request in (chat, text):
        grammar = request(
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        ).grammar()
        assert grammar.description == "response_format.json_schema.schema" and grammar.source


@pytest.mark.parametrize(
    ("response_format", "words"),
    [
        ({"type": "json_schema"}, "needs json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"schema": [1]}}, "a JSON schema is an object"),
        (
            {
                "type": "json_schema",
                "json_schema": {"schema": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}},
            },
            "recurses",
        ),
    ],
)
def test_unusable_response_formats_are_refused(response_format, words):
    error = refused(chat(response_format=response_format).grammar, "response_format")
    assert words in error.message


def test_an_unknown_response_format_type_is_a_validation_error():
    with pytest.raises(ValidationError):
        chat(response_format={"type": "yaml"})


def test_tools_read_as_tools_and_a_choice():
    from tr_cli.text.tools import NO_PARAMETERS, ToolChoice

    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    tools, choice = chat(tools=[tool]).tool_setup()
    assert [(t.name, t.description, t.parameters, t.strict) for t in tools] == [("f", "d", {"type": "object"}, False)]
    assert choice == ToolChoice("auto")
    bare = {"type": "function", "function": {"name": "g", "strict": True}}
    (g,), _ = chat(tools=[bare], tool_choice="none").tool_setup()
    assert g.parameters == NO_PARAMETERS and g.strict
    named = {"type": "function", "function": {"name": "f"}}
    assert chat(tools=[tool], tool_choice=named).tool_setup()[1] == ToolChoice("function", "f")
    refused(
        lambda: chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "x"}}).tool_setup(),
        "tool_choice",
    )
    assert chat().tool_setup() is None and chat(tool_choice="none").tool_setup() is None
    with pytest.raises(ValidationError):
        chat(tools=[{"type": "function", "function": {"name": "bad name"}}])


def test_tool_calls_and_results_stay_in_the_conversation():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    request = chat(
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ]
    )
    messages = request.conversation()
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert messages[2] == {"role": "tool", "content": "done", "tool_call_id": "call_1"}
    assert request.uses_tools() and not chat().uses_tools()


def test_a_model_answers_to_its_argument_path_file_name_and_gguf_name(tmp_path):
    from tr_cli.serve.requests import model_aliases

    path = tmp_path / "qwen2.5-coder-0.5b-instruct.gguf"
    names = model_aliases(str(path), path, "Qwen2.5 Coder 0.5B Instruct")
    assert {str(path), path.name, "qwen2.5-coder-0.5b-instruct", "Qwen2.5 Coder 0.5B Instruct"} <= names
    assert model_aliases("smollm2", None) == {"smollm2"}


def test_the_gguf_name_tr_serve_answers_to_is_read_from_the_files_general_name(tmp_path):
    """tr serve's alias from the file (cli/serve.py): its general.name; none from a file without
    one, one that is no GGUF, or a checkpoint directory."""
    import gguf

    from tr_cli.cli.serve import _general_name
    from tr_cli.models.resolve import ModelSource

    def written(name: str, general_name: str | None) -> ModelSource:
        writer = gguf.GGUFWriter(str(tmp_path / name), "llama")
        if general_name is not None:
            writer.add_name(general_name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return ModelSource("gguf", name, tmp_path / name)

    assert _general_name(written("named.gguf", "Qwen2.5 Coder 0.5B Instruct")) == "Qwen2.5 Coder 0.5B Instruct"
    assert _general_name(written("nameless.gguf", None)) is None
    (tmp_path / "not.gguf").write_bytes(b"not a GGUF")
    assert _general_name(ModelSource("gguf", "not.gguf", tmp_path / "not.gguf")) is None
    assert _general_name(ModelSource("directory", "model", tmp_path)) is None
