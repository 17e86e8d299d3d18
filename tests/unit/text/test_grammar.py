"""Grammars from JSON schemas: what is refused before any decoding (with the problem named), and
the constraint's moves on a real tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from grammar_checks import explore_along, smollm2_compiler

from tr_cli.core.constraint import ConstraintError
from tr_cli.text.grammar import MAX_SCHEMA_CHARS, Grammar, GrammarCompiler, GrammarError

from tiny_models import EOS, VOCAB, tiny_tokenizer


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(tiny_tokenizer(), VOCAB, [EOS])


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "strin"}, "strin"),
        ({"type": 5}, "type must be a string"),
        ({"type": "object", "properties": [1, 2]}, "properties must be an object"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum (5) is greater than maximum (1)"),
        ({"type": "string", "pattern": "(("}, "regex parse error"),
        ({"$ref": "#/$defs/missing"}, "/$defs/missing"),
        ({"$ref": "https://example.com/schema.json"}, "https://example.com/schema.json"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, '"not"'),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "recurses"),
        ({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, "recurses"),
        ("not a schema", "a JSON schema is an object"),
    ],
)
def test_bad_schemas_are_refused_with_the_problem_named(schema, problem):
    """Refused when the grammar is made, before any tokenizer (a command says so before loading)."""
    with pytest.raises(GrammarError) as caught:
        Grammar.json_schema(schema, name="response_format.json_schema.schema")
    message = str(caught.value)
    assert message.startswith("response_format.json_schema.schema: ")
    assert problem in message and "\n" not in message


def test_a_huge_schema_is_refused_before_it_is_compiled():
    schema = {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string", "description": "x" * 200} for i in range(600)},
    }
    assert len(json.dumps(schema)) > MAX_SCHEMA_CHARS
    with pytest.raises(GrammarError, match="at most 100,000"):
        Grammar.json_schema(schema)


def test_recursion_with_an_exit_is_fine(compiler):
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value"],
            }
        },
        "$ref": "#/$defs/node",
    }
    compiler.check(Grammar.json_schema(tree))


def test_lenient_mode_ignores_what_strict_mode_refuses(compiler):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(GrammarError):
        compiler.check(Grammar.json_schema(schema, strict=True))
    compiler.check(Grammar.json_schema(schema, strict=False))


def encode(text: str) -> list[int]:
    return tiny_tokenizer().encode(text)


def test_constraint_follows_a_matching_text_and_refuses_others(compiler):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
    constraint = compiler.constraint(Grammar.json_schema(schema))
    tokens = encode('{"city": "Rome"}')
    mask = constraint.allowed()
    assert mask.shape == (VOCAB,) and bool(mask[tokens[0]]) and constraint.allows(tokens[0])
    assert mask.sum() < VOCAB and not constraint.allows(EOS)  # EOS only once the object is closed
    for token in tokens:
        assert constraint.allows(token)
        constraint.advance(token)
    assert constraint.complete and constraint.allows(EOS)
    constraint.rollback(len(tokens))
    assert not constraint.complete
    bad = encode("[")[0]
    assert not constraint.allows(bad)
    with pytest.raises(ConstraintError):
        constraint.advance(bad)


def test_forced_tokens_spell_what_the_grammar_leaves_no_choice_about(compiler):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    constraint = compiler.constraint(Grammar.json_schema(schema))
    forced = constraint.forced()
    assert forced and tiny_tokenizer().decode(forced) in '{"name": "'
    for token in forced:
        constraint.advance(token)
    assert '{"name": "'.startswith(tiny_tokenizer().decode(forced))


@pytest.mark.parametrize(
    "schema",
    [{"allOf": 5}, {"anyOf": None}, {"type": "object", "properties": {}, "required": [[1]]}],
)
def test_malformed_schemas_are_refused_as_such_never_with_a_crash(schema):
    with pytest.raises(GrammarError):
        Grammar.json_schema(schema)


def test_recursion_through_a_type_that_may_be_null_is_fine_and_deep_chains_are_refused(compiler):
    linked = {"type": ["object", "null"], "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    compiler.check(Grammar.json_schema(linked))
    chain = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(1500)} | {"d1500": {"type": "integer"}}
    with pytest.raises(GrammarError, match="nest too deeply"):
        Grammar.json_schema({"$defs": chain, "$ref": "#/$defs/d0"})


FLAGS = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}, "s": {"type": "string"}},
    "required": ["ok", "n", "s"],
    "additionalProperties": False,
}


def follow_forced(constraint) -> str:
    """Advance through the forced run; its text."""
    forced = constraint.forced()
    for token in forced:
        constraint.advance(token)
    return tiny_tokenizer().decode(forced)


def test_forced_tokens_run_through_every_forced_byte(compiler):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    constraint = compiler.constraint(Grammar.json_schema(schema))
    forced = constraint.forced()
    # The grammar forces `{"name": "` whole, but the engine's forced tokens stop at `":`: the
    # value's opening ` "` could still be part of a longer token (` ""`). It is drafted in the
    # tokenizer's own split, and not as certain: the grammar allows other tokens there.
    assert tiny_tokenizer().decode(forced) == '{"name": "'
    assert constraint.certain(forced) == len(forced) - 1


def test_turns_are_the_whole_words_of_a_choice_and_the_closers_of_a_value(compiler):
    tokenizer = tiny_tokenizer()
    constraint = compiler.constraint(Grammar.json_schema(FLAGS))
    follow_forced(constraint)
    words, closing = constraint.turns(4)
    assert not closing
    # Each choice's longest first token (this vocabulary splits `tr`+`ue`), then what it forces.
    spelled = []
    for token in words:
        constraint.advance(token)
        spelled.append(tokenizer.decode([token, *constraint.forced()]))
        constraint.rollback(1)
    assert sorted(spelled) == ['false, "n": ', 'true, "n": ']
    constraint.advance(words[0])
    follow_forced(constraint)
    constraint.advance(encode("7")[0])
    turns = constraint.turns(4)
    closers = [tokenizer.decode([t]) for t in turns.tokens]
    assert turns.closing and closers and all(text.startswith(",") for text in closers)  # a digit is no turn
    constraint.advance(encode(",")[0])
    follow_forced(constraint)
    for token in encode("ab"):
        constraint.advance(token)
    turns = constraint.turns(4)
    closers = [tokenizer.decode([t]) for t in turns.tokens]
    assert turns.closing and any(text.startswith('"') for text in closers) and all('"' in text for text in closers)
    for token in turns.tokens:  # closing the string ends the object: the reply may end
        constraint.advance(token)
        assert constraint.complete or constraint.forced()
        constraint.rollback(1)


def test_ending_the_reply_can_be_explored_and_undone(compiler):
    """A draft may hold the stop token with more drafts under it; exploring that and undoing it
    must leave the grammar where it was (llguidance's matcher, stopped and rolled back, refuses
    the stop token from then on: a reply that could no longer end where `generate`'s did)."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    explored, clean = (compiler.constraint(Grammar.json_schema(schema)) for _ in range(2))
    for token in encode('{"name": "Ann"}'):
        explored.advance(token)
        clean.advance(token)
    assert explored.allows(EOS) and explored.complete
    explored.advance(EOS)
    # Past the end only the stop token (as a stopped matcher has it): a walk may go on over drafts
    # that repeat it, which the stop condition cuts.
    assert explored.complete and explored.allowed().nonzero().flatten().tolist() == [EOS]
    assert explored.forced() == [] and not explored.turns(4).tokens
    with pytest.raises(ConstraintError):
        explored.advance(encode("a")[0])
    explored.advance(EOS)
    explored.rollback(2)
    assert explored.allows(EOS) and torch.equal(explored.allowed(), clean.allowed())


@pytest.fixture(scope="module")
def smollm2(smollm2_tokenizer_dir):
    return smollm2_compiler(smollm2_tokenizer_dir)


def weather_tool() -> Grammar:
    from tr_cli.text.tools import GenericFormat, Tool, ToolChoice

    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
        "additionalProperties": True,  # as the report's request had it (JSON Schema's own reading)
    }
    return GenericFormat().grammar([Tool("get_weather", "Get the weather", parameters)], ToolChoice("required"))


def test_an_explored_and_undone_draft_leaves_the_grammar_as_a_fresh_replay_has_it(smollm2):
    """Issue 43: a tool call (SmolLM2's tokenizer, free extra arguments) where the tree explored
    ` {"type` (an object's key), masks computed there, and undid it; then ` ["type` (a string in an
    array) was allowed `":`, which consuming it refused (llguidance's own rollback kept something of
    the undone state): the reply died with 'token 1799 refused'. A fresh replay forbids it."""
    tokenizer, compiler = smollm2
    grammar = weather_tool()
    prefix = tokenizer.encode(
        '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C", "type":'
    )
    key, array, word, colon = (tokenizer.convert_tokens_to_ids(t) for t in ('Ġ{"', 'Ġ["', "type", '":'))
    explored, fresh = compiler.constraint(grammar), compiler.constraint(grammar)
    for token in prefix:
        explored.advance(token)
        fresh.advance(token)
    for token in (key, word):
        explored.advance(token)
        explored.allows(colon)  # the mask of the explored state
    explored.rollback(2)
    for token in (array, word):
        explored.advance(token)
        fresh.advance(token)
    assert not fresh.allows(colon)
    assert torch.equal(explored.allowed(), fresh.allowed())
    assert not explored.allows(colon)
    with pytest.raises(ConstraintError):
        explored.advance(colon)
    explored.advance(tokenizer.convert_tokens_to_ids('",'))  # a refused token leaves the state as it was


def test_exploring_drafts_never_changes_what_the_grammar_allows(smollm2):
    """Seeded random exploration along whole replies (a tool call with extra arguments of every
    kind, a schema's object) never leaves the constraint anywhere but where a fresh replay is."""
    tokenizer, compiler = smollm2
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
        "additionalProperties": True,
    }
    cases = [
        (
            weather_tool(),
            '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C", '
            '"type": ["type", {"type": 1}], "x": {"a": [true, null]}}}}',
        ),
        (Grammar.json_schema(person), '{"name": "Ann", "tags": ["a", {"b": "c"}], "age": [1, {"d": []}]}'),
    ]
    for seed, (grammar, text) in enumerate(cases):
        explore_along(compiler, grammar, tokenizer.encode(text), seed)
