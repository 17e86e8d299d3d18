"""The HTTP side of `tr serve` (tr_cli/serve/app.py) in-process, for bodies refused before any
model or decoder is touched: the server is built over a model with no tokenizer and a worker
with no decoder that never starts, so a request that got past parsing would fail loudly. The
refusals that need a model are tests/integration/test_serve.py's."""

import logging

import pytest
from starlette.testclient import TestClient

from tr_cli.serve.app import create_app
from tr_cli.serve.requests import ServedModel
from tr_cli.serve.worker import DecodeWorker

GOOD = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]'


@pytest.fixture()
def client():
    model = ServedModel(
        name="tiny",
        aliases=frozenset(),
        tokenizer=None,
        generation_config=None,
        context_length=None,
        max_depth=1,
        vocab_size=8,
        stop_ids=(),
    )
    worker = DecodeWorker(decoder=None, tokenizer=None, eos_token_ids=[])
    # raise_server_exceptions=False: a bug shows as the 500 a client would get, not as a test error
    with TestClient(create_app(model, worker), raise_server_exceptions=False) as client:
        yield client


def post(client: TestClient, body: bytes, path: str = "/v1/chat/completions"):
    return client.post(path, content=body, headers={"content-type": "application/json"})


def bad_request(response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and set(error) == {"message", "type", "param", "code"}
    return error


def test_json_nested_past_the_recursion_limit_is_a_bad_request_logged_in_one_line(client, caplog):
    deep = b"[" * 100_000 + b"]" * 100_000
    with caplog.at_level(logging.INFO, logger="tr.serve"):
        error = bad_request(post(client, deep))
    assert "JSON" in error["message"] and "nested" in error["message"]
    assert [r.exc_info for r in caplog.records] == [None]  # the access line, no traceback
    assert " 400 " in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("choice", "param", "words"),
    [
        (b'{"type": "function"}', "tool_choice.function", "Field required"),
        (b'{"type": "function", "function": {}}', "tool_choice.function.name", "Field required"),
        (b'{"type": "function", "function": {"name": 3}}', "tool_choice.function.name", "valid string"),
        (b'"sometimes"', "tool_choice", "'auto', 'none' or 'required'"),
    ],
)
def test_a_bad_tool_choice_names_the_member_its_shape_chose(client, choice, param, words):
    """{"type": "function"} without a name cited param `tool_choice.literal['auto','none','required']`."""
    error = bad_request(post(client, GOOD + b', "tool_choice": ' + choice + b"}"))
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error
    assert words in error["message"] and "literal[" not in error["message"], error


@pytest.mark.parametrize("where", ["ignored", "max_tokens"])
def test_an_integer_past_pythons_digit_limit_is_a_bad_request(client, where):
    # Python refuses to convert an integer literal of more than 4,300 digits (sys.int_info).
    huge = b"9" * 5000
    error = bad_request(post(client, GOOD + b', "' + where.encode() + b'": ' + huge + b"}"))
    assert "JSON" in error["message"] and "4300 digits" in error["message"], error["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    "field",
    [
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "max_tokens",
        "seed",
        "n",
        "best_of",
    ],
)
@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_non_finite_number_is_refused_as_such_at_its_field(client, path, field, value):
    body = GOOD if path.endswith("chat/completions") else b'{"model": "tiny", "prompt": "hi"'
    error = bad_request(post(client, body + b', "' + field.encode() + b'": ' + value + b"}", path))
    assert error["param"] == field
    assert error["message"].startswith(f"{field}: not a finite number"), error["message"]
