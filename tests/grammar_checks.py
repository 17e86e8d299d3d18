"""A check of a grammar constraint shared by the unit and property tests: exploring drafts and
undoing them leaves it exactly where a replay without them is."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tr_cli.text.grammar import Grammar, GrammarCompiler


def explore_along(compiler: GrammarCompiler, grammar: Grammar, tokens: list[int], seed: int) -> None:
    """Follow `tokens` with one constraint that, before each, explores drafts as a tree does (the
    reply's own tokens where allowed, a few deep, masks computed, undone) and one that never
    explores: their masks agree at every position."""
    rng = random.Random(seed)
    words = sorted(set(tokens))
    explored, fresh = compiler.constraint(grammar), compiler.constraint(grammar)

    def dive(depth: int) -> None:
        allowed = [token for token in words if explored.allows(token)]
        for token in rng.sample(allowed, min(3, len(allowed))):
            explored.advance(token)
            if depth > 1:
                dive(depth - 1)
            explored.rollback(1)

    for position, token in enumerate(tokens):
        dive(3)
        assert torch.equal(explored.allowed(), fresh.allowed()), (grammar.description, position)
        explored.advance(token)
        fresh.advance(token)


def smollm2_compiler(tokenizer_dir: Path) -> tuple[object, GrammarCompiler]:
    """SmolLM2's tokenizer (from conftest's smollm2_tokenizer_dir) and its grammar compiler."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tokenizer, GrammarCompiler(tokenizer, 49152, [tokenizer.eos_token_id])
