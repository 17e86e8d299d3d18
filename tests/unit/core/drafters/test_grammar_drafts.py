"""The grammar's drafts (forced chains, choices as branches) and text lookup: the trees they
propose, how they are priced, and what they learn from a verification."""

from __future__ import annotations

import pytest
import torch
from set_constraint import SetConstraint

from tr_cli.core.constraint import Turns
from tr_cli.core.drafters.base import Placement, Verification
from tr_cli.core.drafters.grammar_chain import EXIT_PRIOR, GrammarChainDrafter, GrammarRecord
from tr_cli.core.drafters.prompt_lookup import PromptLookup
from tr_cli.core.drafters.text_lookup import TextLookupDrafter
from tr_cli.core.token_text import TokenText
from tr_cli.core.tree_buffers import TreeBuffers

TRUE, FALSE, COMMA, QUOTE, KEY, COLON = 10, 11, 12, 13, 14, 15


class ScriptedGrammar(SetConstraint):
    """`{"flag": true|false, ...}` in miniature: before the value two words are allowed (no run
    forced); after either, `, "key":` is forced, of which the comma alone is certain."""

    def __init__(self) -> None:
        super().__init__(lambda path: self._allowed(), 20)

    def _allowed(self) -> set[int]:
        if not self.path:
            return {TRUE, FALSE}
        if self.path[-1] in (TRUE, FALSE):
            return {COMMA}
        return {QUOTE, KEY, COLON}

    def forced(self) -> list[int]:
        return [COMMA, QUOTE, KEY, COLON] if self.path and self.path[-1] in (TRUE, FALSE) else []

    def turns(self, limit: int) -> Turns:
        return Turns([TRUE, FALSE][:limit] if not self.path else [], closing=False)

    def certain(self, tokens: list[int]) -> int:
        return 1 if tokens[:1] == [COMMA] else 0


def verification(tokens: list[int], parents: tuple[int, ...], correct: list[bool]) -> Verification:
    from tr_cli.core.tree import EXTERNAL, TreeSpec

    spec = TreeSpec("t", parents, (0, *(EXTERNAL,) * (len(parents) - 1)))
    return Verification(
        tokens=torch.tensor(tokens),
        candidates=torch.zeros(len(tokens), 1, dtype=torch.long),
        correct=torch.tensor(correct),
        tree=TreeBuffers.build(spec, "cpu"),
    )


def test_choices_are_branches_each_with_the_run_forced_after_it():
    grammar = ScriptedGrammar()
    drafter = GrammarChainDrafter(grammar, "cpu")
    draft = drafter.propose(root=1)
    # root -> true -> , " key :   and   root -> false -> , " key :
    assert draft.spec.parents == (-1, 0, 1, 2, 3, 4, 0, 6, 7, 8, 9)
    assert draft.tokens.tolist() == [1, TRUE, COMMA, QUOTE, KEY, COLON, FALSE, COMMA, QUOTE, KEY, COLON]
    p = draft.probabilities
    rate = drafter.rate
    assert p[0] == p[1] == 0.5  # an even share before any evidence; the certain comma keeps it
    assert p[2] == 0.5 * rate and p[4] == 0.5 * rate**3
    assert grammar.path == []  # exploring the branches left the grammar where it was


def test_a_forced_run_is_one_chain_and_its_certain_head_keeps_probability_one():
    grammar = ScriptedGrammar()
    grammar.advance(TRUE)
    drafter = GrammarChainDrafter(grammar, "cpu")
    draft = drafter.propose(root=TRUE)
    assert draft.spec.parents == (-1, 0, 1, 2, 3)
    assert draft.probabilities[0] == 1.0 and draft.probabilities[1] < 1.0


def test_the_record_learns_which_choice_the_model_takes_and_outlives_the_drafter():
    record = GrammarRecord()
    for _ in range(6):  # the model writes `false` every time
        drafter = GrammarChainDrafter(ScriptedGrammar(), "cpu", record=record)
        draft = drafter.propose(root=1)
        tokens = draft.tokens.tolist()
        correct = [True, False, False, False, False, False, True, True, True, True, False]
        drafter.learn(verification(tokens, draft.spec.parents, correct), Placement.contiguous(1, 10))
    assert record.taken[FALSE] == 6 and record.offered[FALSE] == 6 and record.taken[TRUE] == 0
    # Forced nodes after the wrong branch say nothing; after the right one, the uncertain ones count.
    assert record.trials == 6 * 3 and record.hits == 6 * 2
    draft = GrammarChainDrafter(ScriptedGrammar(), "cpu", record=record).propose(root=1)
    p_true, p_false = draft.probabilities[0], draft.probabilities[5]
    assert p_false >= 0.8 and p_true <= 0.2
    assert record.turn_rate(99, EXIT_PRIOR) == EXIT_PRIOR  # a closer never offered: its prior


def test_nodes_a_planner_left_out_teach_nothing():
    record = GrammarRecord()
    drafter = GrammarChainDrafter(ScriptedGrammar(), "cpu", record=record)
    draft = drafter.propose(root=1)
    # Only the `true` branch's first two nodes were verified (merged nodes 1, 2).
    placement = Placement((1, 2, -1, -1, -1, -1, -1, -1, -1, -1))
    drafter.learn(verification([1, TRUE, COMMA], (-1, 0, 1), [True, True, True]), placement)
    assert record.offered[TRUE] == 1 and record.offered[FALSE] == 0
    assert record.trials == 0  # the comma is certain
    assert draft.tokens.tolist()[1:3] == [TRUE, COMMA]


class LongestMatch(TokenText):
    """A tokenizer in miniature that splits text as BPE vocabularies do: words with their leading
    space are single tokens, so the same word after a quote is split otherwise."""

    WORDS = [" my", " name", " is", " Annabel", " Kowalski", " and", " live", " in", " Rome", " Bob", " went"]
    PIECES = ['{"', '":', ' "', "name", "Anna", "bel", "ob", *WORDS]

    def __init__(self) -> None:
        self.pieces = [chr(c).encode() for c in range(32, 127)] + [p.encode() for p in self.PIECES]

    def piece(self, token: int) -> bytes:
        return self.pieces[token]

    def encode(self, text: bytes) -> list[int]:
        out, at = [], 0
        while at < len(text):
            token = max(
                (i for i, p in enumerate(self.pieces) if text.startswith(p, at)), key=lambda i: len(self.pieces[i])
            )
            out.append(token)
            at += len(self.pieces[token])
        return out

    def decode(self, tokens) -> bytes:
        return b"".join(self.pieces[t] for t in tokens)


def test_text_lookup_drafts_a_copy_that_token_lookup_cannot_see():
    text = LongestMatch()
    paragraph = text.encode(b"Dear team, my name is Annabel Kowalski and I live in Rome.")
    reply = text.encode(b'{"name": "Anna')
    drafter = TextLookupDrafter(text, length=3)
    drafter.extend(paragraph + reply)
    found = drafter.continuations(3, 4)
    # The copy in the reply's own split: `bel` (not ` Annabel`'s), then the space-led words.
    assert found and found[0].tokens == tuple(text.encode(b"bel Kowalski and"))
    # Token lookup over the same tokens has no earlier `Anna` to match: it misses the copy.
    tokens = PromptLookup()
    tokens.extend(paragraph + reply)
    assert all(c.tokens[:1] != found[0].tokens[:1] for c in tokens.continuations(3, 4))


def test_text_lookup_short_matches_start_words_on_both_sides():
    text = LongestMatch()
    drafter = TextLookupDrafter(text, length=2)
    drafter.extend(text.encode(b"abBc xyz Bob went home"))
    drafter.extend(text.encode(b' "B'))
    continuations = [text.decode(c.tokens) for c in drafter.continuations(2, 4)]
    assert continuations == [b"ob went"]  # not from the "B" inside `abBc`
    # A tail of punctuation alone (a quote just opened) starts no word: it would match every quote.
    drafter.reset()
    drafter.extend(text.encode(b'say "hi", then "'))
    assert drafter.continuations(2, 4) == []


def test_text_lookup_finds_nothing_in_a_fresh_conversation_and_forgets_on_reset():
    text = LongestMatch()
    drafter = TextLookupDrafter(text, length=4)
    assert drafter.propose(5) is None
    drafter.extend(text.encode(b"alpha beta alpha"))
    assert drafter.continuations(4, 4)
    drafter.reset()
    assert drafter.continuations(4, 4) == []


class NumberGrammar(ScriptedGrammar):
    """Inside a number: a digit (20) may go on, or a comma closes it, after which `"key":` is forced."""

    def _allowed(self) -> set[int]:
        rest = self.forced()
        return {20, COMMA} if COMMA not in self.path else set(rest[:1])

    def forced(self) -> list[int]:
        if COMMA not in self.path:
            return []
        return [QUOTE, KEY, COLON][len(self.path) - self.path.index(COMMA) - 1 :]

    def turns(self, limit: int) -> Turns:
        return Turns([COMMA] if COMMA not in self.path else [], closing=True)

    def certain(self, tokens: list[int]) -> int:
        return 0


def test_closing_a_value_that_may_go_on_is_priced_apart_from_a_choice():
    drafter = GrammarChainDrafter(NumberGrammar(), "cpu")
    draft = drafter.propose(root=20)
    assert draft.tokens.tolist() == [20, COMMA, QUOTE, KEY, COLON]
    # One closing is not a sure thing the way the only word of a choice would be.
    assert draft.probabilities[0] == EXIT_PRIOR
    assert draft.probabilities[1] == pytest.approx(EXIT_PRIOR * drafter.rate)


class ClosingGrammar(NumberGrammar):
    """Three ways to close the open value (16, 17, COMMA), each followed by `"key":`."""

    CLOSINGS = (16, 17, COMMA)

    def _allowed(self) -> set[int]:
        done = [t for t in self.path if t in self.CLOSINGS]
        if not done:
            return {20, *self.CLOSINGS}
        rest = [QUOTE, KEY, COLON][len(self.path) - self.path.index(done[0]) - 1 :]
        return set(rest[:1])

    def forced(self) -> list[int]:
        done = [t for t in self.path if t in self.CLOSINGS]
        return [QUOTE, KEY, COLON][len(self.path) - self.path.index(done[0]) - 1 :] if done else []

    def turns(self, limit: int) -> Turns:
        return Turns(list(self.CLOSINGS) if not self.path else [], closing=True)


def test_of_the_ways_to_close_only_the_ones_the_model_took_most_are_drafted():
    record = GrammarRecord()
    record.offered.update({16: 10, 17: 10, COMMA: 10})
    record.taken.update({16: 1, 17: 6, COMMA: 3})
    draft = GrammarChainDrafter(ClosingGrammar(), "cpu", record=record).propose(root=20)
    firsts = [token for token, parent in zip(draft.tokens.tolist(), draft.spec.parents, strict=True) if parent == 0]
    assert firsts == [17, COMMA]  # MAX_CLOSINGS of them, likeliest first
    assert draft.probabilities[0] == pytest.approx(record.turn_rate(17, EXIT_PRIOR))
