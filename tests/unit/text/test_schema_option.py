"""`--schema` / `--json`: the grammar a command-line reply must match, read and checked before any
model loads; every bad input is one line naming the file, the line or the keyword."""

from __future__ import annotations

import json

import pytest

from tr_cli.errors import UserError
from tr_cli.text.grammar import Grammar
from tr_cli.text.schema_option import reply_grammar

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def test_free_text_json_and_a_schema_from_a_file_or_inline(tmp_path):
    assert reply_grammar(None, False) is None
    assert reply_grammar(None, True) == Grammar.json_object()
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA, indent=2))
    from_file = reply_grammar(str(path), False)
    inline = reply_grammar(json.dumps(SCHEMA), False)
    assert from_file.source == inline.source == Grammar.json_schema(SCHEMA).source
    assert from_file.description == str(path) and inline.description == "--schema"


def test_a_schema_that_is_not_json_names_its_file_line_and_column(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text('{"type": "object",\n "properties": {"a": 1,}\n}\n')
    with pytest.raises(UserError, match=rf"^{path}:2:24: not JSON \(Expecting property name"):
        reply_grammar(str(path), False)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": 5}, "type must be a string"),
        ([1, 2], "a JSON schema is an object"),
    ],
)
def test_a_schema_the_grammar_cannot_enforce_names_the_problem(tmp_path, schema, problem):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    with pytest.raises(UserError) as caught:
        reply_grammar(str(path), False)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and problem in message and "\n" not in message


def test_a_missing_file_an_unreadable_one_and_both_options_are_refused(tmp_path):
    with pytest.raises(UserError, match="no such file; give a JSON Schema file"):
        reply_grammar(str(tmp_path / "missing.json"), False)
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"description": "caf\xe9"}'.encode("latin-1"))
    with pytest.raises(UserError, match="cannot read it as UTF-8"):
        reply_grammar(str(latin1), False)
    with pytest.raises(UserError, match="give one"):
        reply_grammar(json.dumps(SCHEMA), True)


def test_a_folder_or_a_path_the_os_refuses_is_one_line_naming_it(tmp_path):
    with pytest.raises(UserError, match=rf"^--schema {tmp_path}: is a folder"):
        reply_grammar(str(tmp_path), False)
    with pytest.raises(UserError, match=r"^--schema ~no-such-user-tr/s.json: cannot use this path"):
        reply_grammar("~no-such-user-tr/s.json", False)
    with pytest.raises(UserError, match="cannot use this path .*File name too long"):
        reply_grammar("x" * 5000 + ".json", False)


@pytest.mark.parametrize("text", [f"  \n{json.dumps(SCHEMA)}\n", f"\ufeff{json.dumps(SCHEMA)}"])
def test_inline_schemas_may_start_with_spaces_or_a_byte_order_mark(text):
    assert reply_grammar(text, False).source == Grammar.json_schema(SCHEMA).source


def test_the_schemas_true_and_false_are_inline_not_file_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file named true or false here
    assert reply_grammar(" true ", False).source == Grammar.json_schema({}).source  # any JSON value
    with pytest.raises(UserError, match=r"^--schema: the schema false allows no value at all"):
        reply_grammar("false", False)


def test_a_schema_nested_past_what_json_reads_is_one_line():
    with pytest.raises(UserError, match=r"^--schema: nested too deeply to read"):
        reply_grammar('{"a":' * 100_000 + "1" + "}" * 100_000, False)


def test_an_integer_past_pythons_digit_limit_is_one_line(tmp_path):
    # Python refuses to convert an integer literal of more than 4,300 digits: 'unexpected ValueError'
    path = tmp_path / "s.json"
    path.write_text('{"type": "integer", "maximum": ' + "9" * 5000 + "}")
    for schema, where in ((str(path), str(path)), (path.read_text(), "--schema")):
        with pytest.raises(UserError) as caught:
            reply_grammar(schema, False)
        assert str(caught.value).startswith(f"{where}: not JSON (Exceeds the limit (4300 digits)"), str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "fault"),
    [("[a-", "unclosed character class"), ("a{2,1}", "invalid repetition count range")],
)
def test_a_bad_pattern_names_its_fault(pattern, fault):
    """It said `regex parse error:` and nothing else (the first of four lines)."""
    schema = json.dumps({"type": "string", "pattern": pattern})
    with pytest.raises(UserError) as caught:
        reply_grammar(schema, False)
    message = str(caught.value)
    assert f"regex parse error in {pattern!r}: {fault}" in message and "\n" not in message, message


def test_a_schema_from_a_fifo_is_read(tmp_path):
    """`--schema <(...)` hands over a pipe: it was "no such file"."""
    import os
    import threading

    fifo = tmp_path / "schema"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(json.dumps(SCHEMA)))
    writer.start()
    assert reply_grammar(str(fifo), False).source == Grammar.json_schema(SCHEMA).source
    writer.join()
