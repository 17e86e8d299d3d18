"""Constrained Token Recycling equals constrained `generate`, token for token, in float32: greedy,
and seeded sampling (the reference draws each token from transformers' own warpers with the same
per-position uniforms tr's sampler uses). On every tiny architecture, with the paper's tree, a
designed tree with a lookup chain, and the grammar's own forced-token chain."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.core.design.cost_model import CostModel
from tr_cli.core.drafters import DraftPlan
from tr_cli.core.sampling import draw, positional_uniform
from tr_cli.core.sampling_config import SamplingConfig
from tr_cli.text.grammar import Grammar, GrammarCompiler
from tr_cli.text.grammar_logits import GrammarLogitsProcessor

from tiny_models import ARCHITECTURES, EOS, VOCAB, reference_with_logprobs, tiny_model, tiny_tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["math", "poetry", "city"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
SHAPE = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
            "required": ["kind", "r"],
        },
        {
            "type": "object",
            "properties": {"kind": {"const": "box"}, "ok": {"type": "boolean"}},
            "required": ["kind", "ok"],
        },
    ]
}
PROMPTS = ["Extract: Ada is 36 and likes math.", '{"items": [{"id": 1', "The city of Paris, population"]
BUDGET = 50


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(tiny_tokenizer(), VOCAB, [EOS])


@pytest.fixture(scope="module", params=ARCHITECTURES)
def model(request):
    return tiny_model(request.param)


class UniformDraw(LogitsProcessor):
    """The last processor of the sampled reference: draws the token from the processed scores
    with tr's per-position uniform for this seed, and leaves generate (greedy) only that token."""

    def __init__(self, seed: int) -> None:
        key = int(torch.randint(0, 2**63 - 1, (), generator=torch.Generator().manual_seed(seed)))
        self.uniform = positional_uniform(key)

    def __call__(self, input_ids, scores):
        token = draw(torch.softmax(scores[0].float(), dim=-1), self.uniform(input_ids.shape[1]))
        out = torch.full_like(scores, float("-inf"))
        out[0, token] = 0.0
        return out


def reference(model, ids, constraint, sampling: SamplingConfig | None = None) -> list[int]:
    processors = [GrammarLogitsProcessor(constraint, len(ids))]
    if sampling is not None:
        processors += [TemperatureLogitsWarper(sampling.temperature), TopKLogitsWarper(sampling.top_k)]
        processors.append(UniformDraw(sampling.seed))
    return reference_with_logprobs(model, ids, BUDGET, logprobs=False, processors=processors)[0]


def designed_decoder(model, sampling=None) -> TokenRecyclingDecoder:
    cost = CostModel((1, 8, 32, 64), (0.010, 0.011, 0.014, 0.030))
    drafters = DraftPlan.of(None, {"lookup": 6}).drafters("cpu")
    return TokenRecyclingDecoder(model, cost=cost, drafters=drafters, sampling=sampling)


def run(decoder, compiler, grammar, ids, keep_events=False):
    decoder.reset()
    decoder.set_constraint(compiler.constraint(grammar))
    return decoder.generate(ids, StopCondition.build(BUDGET, [EOS]), keep_events=keep_events)


@pytest.mark.parametrize("schema", [PERSON, SHAPE], ids=["person", "anyof"])
def test_greedy_constrained_equals_generate(model, compiler, schema):
    grammar = Grammar.json_schema(schema)
    tokenizer = tiny_tokenizer()
    for decoder in (TokenRecyclingDecoder(model), designed_decoder(model)):  # warm across prompts
        for text in PROMPTS:
            ids = tokenizer.encode(text)
            result = run(decoder, compiler, grammar, ids)
            assert result.tokens == reference(model, ids, compiler.constraint(grammar)), text


def test_seeded_sampling_constrained_equals_generate(model, compiler):
    grammar = Grammar.json_schema(PERSON)
    tokenizer = tiny_tokenizer()
    for seed in (1, 2):
        sampling = SamplingConfig(temperature=0.8, top_k=20, seed=seed)
        for text in PROMPTS[:2]:
            ids = tokenizer.encode(text)
            result = run(designed_decoder(model, sampling), compiler, grammar, ids)
            assert result.tokens == reference(model, ids, compiler.constraint(grammar), sampling), (seed, text)


def test_replies_that_end_are_instances_and_structure_is_drafted_for_free(compiler):
    """A finished reply parses and fits the schema; the grammar's forced tokens (keys, quotes,
    separators) were drafted and accepted; no verified node was one the grammar forbids."""
    model = tiny_model("gpt2")
    grammar = Grammar.json_schema(PERSON)
    tokenizer = tiny_tokenizer()
    decoder = designed_decoder(model)
    finished = 0
    from_grammar = 0
    for text in PROMPTS:
        result = run(decoder, compiler, grammar, tokenizer.encode(text), keep_events=True)
        if result.stats.finish_reason == "eos":
            finished += 1
            value = json.loads(tokenizer.decode(result.tokens[:-1]))
            assert set(value) == {"name", "age", "tags"} and isinstance(value["age"], int)
            assert len(value["name"]) <= 12 and set(value["tags"]) <= {"math", "poetry", "city"}
        from_grammar += sum(event.accepted_by_source.get("grammar", 0) for event in result.events)
        # Every verified node's path is allowed: replay each step's tree against a fresh grammar.
        check = compiler.constraint(grammar)
        for event in result.events:
            tokens = event.tree_tokens.tolist() if event.tree is not None else [None]
            for node in range(1, len(tokens)):
                parents = event.tree.parents
                path = []
                while node > 0:
                    path.append(tokens[node])
                    node = parents[node]
                for token in reversed(path):
                    assert check.allows(token)
                    check.advance(token)
                check.rollback(len(path))
            for token in event.new_tokens:
                if token != EOS:
                    check.advance(token)
    assert finished >= 1
    assert from_grammar >= 10


def test_constraint_ends_with_the_reply(compiler):
    """The next, unconstrained reply is plain greedy decoding again, continuing the conversation."""
    from tiny_models import reference as plain_reference

    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    decoder = TokenRecyclingDecoder(model)
    decoder.set_constraint(compiler.constraint(Grammar.json_object()))
    ids = tokenizer.encode(PROMPTS[0])
    first = decoder.generate(ids, StopCondition.build(BUDGET, [EOS])).tokens
    assert tokenizer.decode(first).startswith("{")
    decoder.set_constraint(None)
    assert [d.name for d in decoder.drafters] == ["matrix"]
    more = tokenizer.encode(" and then")
    second = decoder.generate(more, StopCondition.build(20, [EOS])).tokens
    assert second == plain_reference(model, ids + first + more, 20)
