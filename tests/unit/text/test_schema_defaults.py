"""What a schema leaves unsaid (tr_cli/text/schema_defaults.py): objects closed, numbers and
strings bounded by default, as JSON Schema reads it on request; checked on the grammar."""

from __future__ import annotations

import pytest

from tr_cli.core.constraint import ConstraintError
from tr_cli.text.grammar import Grammar, GrammarCompiler
from tr_cli.text.schema_defaults import (
    AS_WRITTEN,
    MAX_FRACTION_DIGITS,
    MAX_INTEGER_DIGITS,
    MAX_STRING_CHARS,
    MAX_WHOLE_DIGITS,
    STRICT,
)
from tr_cli.text.tools import Tool

from tiny_models import EOS, VOCAB, tiny_tokenizer

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "people": {"type": "integer"}}}


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(tiny_tokenizer(), VOCAB, [EOS])


def follows(compiler, schema, text: str) -> bool:
    constraint = compiler.constraint(Grammar.json_schema(schema, strict=False))
    try:
        for token in tiny_tokenizer().encode(text):
            constraint.advance(token)
    except ConstraintError:
        return False
    return constraint.allows(EOS)


def test_an_object_that_does_not_mention_other_keys_takes_none_and_each_key_once(compiler):
    closed = STRICT.apply(CITY)
    assert follows(compiler, closed, '{"city": "Oslo", "people": 5}')
    assert not follows(compiler, closed, '{"city": "Oslo", "type": "string"}')
    assert not follows(compiler, closed, '{"city": "Oslo", "city": "Rome"}')
    # As JSON Schema reads it: other keys allowed, on request.
    assert follows(compiler, AS_WRITTEN.apply(CITY), '{"city": "Oslo", "type": "string"}')
    # What the schema says stays as said: an object open on purpose, a free dictionary.
    assert follows(compiler, STRICT.apply({**CITY, "additionalProperties": True}), '{"city": "a", "x": 1}')
    assert follows(compiler, STRICT.apply({"type": "object"}), '{"x": 1}')


def test_nested_objects_and_definitions_are_closed_but_allof_parts_are_left_to_merge():
    schema = {
        "type": "object",
        "properties": {"to": {"$ref": "#/$defs/Point"}, "all": {"type": "array", "items": {"properties": {}}}},
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "allOf": [{"properties": {"a": {}}}],
    }
    read = STRICT.apply(schema)
    assert read["$defs"]["Point"]["additionalProperties"] is False
    assert read["properties"]["all"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in read["allOf"][0] and "additionalProperties" not in read
    assert schema["$defs"]["Point"] == {"type": "object", "properties": {"x": {"type": "integer"}}}  # unchanged


def test_numbers_without_bounds_get_a_bounded_count_of_digits(compiler):
    integer, number = STRICT.apply({"type": "integer"}), STRICT.apply({"type": ["number", "null"]})
    assert follows(compiler, integer, "9" * MAX_INTEGER_DIGITS) and follows(compiler, integer, "-42")
    assert not follows(compiler, integer, "9" * (MAX_INTEGER_DIGITS + 1))
    assert follows(compiler, number, "1" * MAX_WHOLE_DIGITS + "." + "5" * MAX_FRACTION_DIGITS)
    assert follows(compiler, number, "null") and follows(compiler, number, "-2.25")
    assert not follows(compiler, number, "1" * (MAX_WHOLE_DIGITS + 1))
    assert not follows(compiler, number, "1." + "5" * (MAX_FRACTION_DIGITS + 1))
    assert follows(compiler, AS_WRITTEN.apply({"type": "integer"}), "9" * 40)
    # The schema's own bounds hold as written.
    assert STRICT.apply({"type": "integer", "minimum": 0}) == {"type": "integer", "minimum": 0}


def test_strings_without_bounds_get_a_length_limit(compiler):
    string = STRICT.apply({"type": "string"})
    assert string["maxLength"] == MAX_STRING_CHARS
    assert follows(compiler, {"type": "string", "maxLength": 3}, '"abc"')
    assert STRICT.apply({"type": "string", "pattern": "^a+$"}) == {"type": "string", "pattern": "^a+$"}
    assert STRICT.apply({"enum": ["a", "b"]}) == {"enum": ["a", "b"]}


def test_a_tools_arguments_are_held_to_the_read_schema_and_its_description_stays_as_given():
    tool = Tool("f", "", CITY)
    assert tool.held_to["additionalProperties"] is False and "additionalProperties" not in tool.as_template()
