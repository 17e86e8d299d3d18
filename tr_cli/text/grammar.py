"""Grammars for structured output, and the constraint the decoder follows (core/constraint.py),
on llguidance.

A `Grammar` is a user's choice made once at the edge (a JSON schema, any JSON object) and checked
there: a schema that is not valid JSON Schema, uses keywords that cannot be enforced (in strict
mode), recurses with no way to end, or is too big is refused with a `GrammarError` naming the
problem before any decoding. `GrammarCompiler` holds llguidance's view of the tokenizer (built
once: ~0.5 s) and turns a grammar into a fresh `GrammarConstraint` per reply.

JSON is written compactly with a space after ':' and ',' (`{"a": 1, "b": [2, 3]}`), with no other
whitespace: a free whitespace rule lets small models pad with newlines until the token limit, and
fixed separators are bytes the grammar forces, drafted for free (drafters/grammar_chain.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from ..core.constraint import ConstraintError, TokenConstraint, Turns
from ..core.drafters.plan import MAX_DEPTH
from ..core.token_text import TokenText

CLOSING = b'",}]'  # the bytes a token that closes a JSON value may start with
FEW_ALLOWED = 24  # a state allowing at most this many tokens is a choice among words (true/false, an enum)
# Tokens a constraint can undo: more than the deepest draft explored under its state (a source's
# draft of MAX_DEPTH tokens, the grammar's own chain and a choice before it).
MAX_UNDO = 2 * MAX_DEPTH

MAX_SCHEMA_CHARS = 100_000  # a schema's JSON text; OpenAI's own limits are of the same order
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that cannot be used, with what is wrong in words for the user."""


@dataclass(frozen=True)
class Grammar:
    """What a reply must match: llguidance's grammar text and a name for messages."""

    source: str
    description: str

    @classmethod
    def json_schema(cls, schema: Any, strict: bool = True, name: str = "schema") -> Grammar:
        """Replies that are JSON instances of `schema`. Strict: a keyword llguidance cannot
        enforce (uniqueItems, if/then, not, ...) is an error; not strict: such keywords are
        ignored and the rest still holds."""
        import llguidance

        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"{name}: a JSON schema is an object (or true/false), got {type(schema).__name__}")
        if schema is False:
            raise GrammarError(f"{name}: the schema false allows no value at all; give one that some reply can match")
        if schema is True:  # any JSON value; llguidance takes that as the empty object schema only
            schema = {}
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_CHARS:
            raise GrammarError(f"{name}: {len(text):,} characters of JSON; at most {MAX_SCHEMA_CHARS:,}")
        _check_recursion(schema, name)
        try:
            source = llguidance.LLMatcher.grammar_from_json_schema(
                text, defaults=JSON_LAYOUT, overrides={"lenient": not strict}
            )
        except ValueError as exc:
            raise GrammarError(f"{name}: {exc}") from None
        grammar = cls(source, name)
        _validate(grammar, None)  # what needs no tokenizer (unsupported keywords, bad types) is said here
        return grammar

    @classmethod
    def lark(cls, source: str, description: str) -> Grammar:
        """A grammar in llguidance's Lark dialect (JSON schemas embed as `%json {...}` rules)."""
        return cls(source, description)

    @classmethod
    def json_object(cls) -> Grammar:
        """Replies that are one JSON object (OpenAI's JSON mode)."""
        return cls.json_schema({"type": "object"}, name="JSON object")


class GrammarCompiler:
    """llguidance's tokenizer for one model: the output vocabulary (rows past the tokenizer's own
    never allowed) and its stop tokens, which a grammar allows once its text is complete."""

    def __init__(self, tokenizer: object, vocab_size: int, stop_ids: Iterable[int]) -> None:
        import llguidance.hf

        self.vocab_size = vocab_size
        try:
            self._tokenizer = llguidance.hf.from_tokenizer(
                tokenizer, n_vocab=vocab_size, eos_token=sorted(set(stop_ids))
            )
        except Exception as exc:  # noqa: BLE001 - llguidance takes only fast (Rust) tokenizers
            raise GrammarError(f"structured output cannot use this model's tokenizer: {exc}") from None

    def check(self, grammar: Grammar) -> None:
        """GrammarError when llguidance refuses the grammar (its message names the problem)."""
        _validate(grammar, self._tokenizer)

    def constraint(self, grammar: Grammar) -> GrammarConstraint:
        """A fresh constraint in the grammar's initial state; GrammarError (the same message `check`
        gives) when it cannot be built."""
        return GrammarConstraint(self._tokenizer, grammar, self.vocab_size, self.closers, self.token_text)

    @cached_property
    def token_text(self) -> GrammarTokenText:
        return GrammarTokenText(self._tokenizer)

    @cached_property
    def closers(self) -> tuple[int, ...]:
        """Tokens that may close a JSON value: made of closing quotes, brackets, braces and commas
        (spaces between), starting with one (`",`, `"}`, `],`, `,`). Inside a string the ones not
        starting with a quote are text; GrammarConstraint.turns tells them apart."""
        out = []
        for token in range(min(self.vocab_size, self._tokenizer.vocab_size)):
            if self._tokenizer.is_special_token(token):
                continue
            text = self._tokenizer.decode_bytes([token])
            if text and text[:1] in CLOSING and not text.strip(CLOSING + b" "):
                out.append(token)
        return tuple(out)


class GrammarTokenText(TokenText):
    """The model's tokens as the grammar engine reads them: the same bytes the grammar matches,
    and the tokenizer's own split (llguidance calls the model's fast tokenizer)."""

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer
        self._pieces: dict[int, bytes] = {}

    def piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._tokenizer.decode_bytes([token])
        return piece

    def encode(self, text: bytes) -> list[int]:
        return list(self._tokenizer.tokenize_bytes(text))


class GrammarConstraint(TokenConstraint):
    """One reply's grammar state (an llguidance matcher). The mask of the current state is
    computed once, on first use after each move, into a buffer of one bit per token; undoing a
    move brings back the state before it with its mask."""

    def __init__(
        self,
        tokenizer: object,
        grammar: Grammar,
        vocab_size: int,
        closers: tuple[int, ...] = (),
        token_text: GrammarTokenText | None = None,
    ) -> None:
        import llguidance

        self.grammar = grammar
        self.vocab_size = vocab_size
        self.closers = closers
        self.token_text = token_text or GrammarTokenText(tokenizer)
        self._tokenizer = tokenizer
        self._matcher = llguidance.LLMatcher(tokenizer, grammar.source, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"{grammar.description}: {_first_line(self._matcher.get_error())}")
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
        self._fresh = False
        # Undo is by snapshots, never llguidance's own rollback: after a mask computed in a state
        # that is then rolled back, llguidance 1.9's rollback can leave a matcher whose masks allow
        # tokens that a fresh replay of the same tokens forbids (issue 43: after ` {"type` explored
        # and undone, ` ["type` then allowed `":`, which consume refused). A copy is a few
        # microseconds; each advance consumes on a copy and keeps the state (and its mask) it
        # left, at most MAX_UNDO of them. A refused token leaves the matcher as it was.
        self._undo: list[tuple[object, np.ndarray, bool]] = []
        # A stop token ends the reply. It is kept out of the matcher: llguidance stops there, and
        # undoing it leaves a matcher that no longer allows the stop token (the state is lost),
        # while drafts are explored and undone. Past it only stop tokens are allowed (as in a
        # stopped matcher); `_ended` counts those advanced.
        self._stops = frozenset(tokenizer.eos_tokens)
        self._ended = 0

    def _mask_bits(self) -> np.ndarray:
        if not self._fresh:
            self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            self._check()
            self._fresh = True
        return self._bits

    def _check(self) -> None:
        if self._matcher.is_error():
            raise ConstraintError(f"{self.grammar.description}: {_first_line(self._matcher.get_error())}")

    def allows(self, token: int) -> bool:
        if self._ended:
            return token in self._stops
        if not 0 <= token < self.vocab_size:
            return False
        return bool((int(self._mask_bits()[token >> 5]) >> (token & 31)) & 1)

    def allowed(self) -> torch.Tensor:
        if self._ended:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            mask[[token for token in self._stops if token < self.vocab_size]] = True
            return mask
        bits = np.unpackbits(self._mask_bits().view(np.uint8), bitorder="little")[: self.vocab_size]
        return torch.from_numpy(bits.astype(np.bool_))

    def advance(self, token: int) -> None:
        if token in self._stops:
            if not self.allows(token):
                raise ConstraintError(f"{self.grammar.description}: the reply cannot end here (token {token})")
            self._ended += 1  # the matcher and the mask in the buffer stay as they were
            return
        if self._ended:
            raise ConstraintError(f"{self.grammar.description}: token {token} refused (the reply has ended)")
        following = self._matcher.deep_copy()
        if not following.consume_token(token):
            reason = _first_line(following.get_error())
            raise ConstraintError(f"{self.grammar.description}: token {token} refused ({reason})")
        self._undo.append((self._matcher, self._bits, self._fresh))
        if len(self._undo) > MAX_UNDO:
            del self._undo[0]  # a snapshot holds the whole parse so far: only the recent ones are kept
        self._matcher = following
        self._bits = np.empty_like(self._bits)
        self._fresh = False

    def rollback(self, count: int) -> None:
        undone = min(count, self._ended)
        self._ended -= undone
        count -= undone
        if count == 0:
            return
        if count > len(self._undo):
            raise ConstraintError(f"{self.grammar.description}: could not undo {count} tokens (at most {MAX_UNDO})")
        self._matcher, self._bits, self._fresh = self._undo[-count]
        del self._undo[-count:]

    def forced(self) -> list[int]:
        if self._ended:
            return []
        tokens = list(self._matcher.compute_ff_tokens())
        # The forced bytes can run past the forced tokens where a longer token could still take
        # them (`": "` forces `":` while ` "` may yet be ` ""`): drafted in the tokenizer's own
        # split, which the model nearly always writes. They are not certain (GrammarConstraint.certain).
        forced_bytes = self._matcher.compute_ff_bytes()
        covered = b"".join(self.token_text.piece(token) for token in tokens)
        if len(forced_bytes) > len(covered) and forced_bytes.startswith(covered):
            drafted = tokens + self.token_text.encode(forced_bytes[len(covered) :])
            tokens = drafted[: self._matcher.validate_tokens(drafted)]
        return tokens

    def turns(self, limit: int) -> Turns:
        if self._ended:
            return Turns([], closing=False)
        allowed = np.unpackbits(self._mask_bits().view(np.uint8), bitorder="little")[: self.vocab_size]
        few = int(allowed.sum()) <= FEW_ALLOWED
        if few:
            # `true` and `false` are allowed with all their prefixes (`t`, `tr`, ...); the model
            # writes whole words, so the tokens no other allowed token extends are the choices.
            # (A stop token ends the reply: nothing to draft after it.)
            tokens = [t for t in np.flatnonzero(allowed).tolist() if not self._tokenizer.is_special_token(t)]
            text = {token: self._tokenizer.decode_bytes([token]) for token in tokens}
            candidates = [t for t in tokens if not any(o != t and text[o].startswith(text[t]) for o in tokens)]
        else:
            candidates = [token for token in self.closers if self.allows(token)]
            # Where a quote may come, a string is open and only a quote can close it (its commas
            # and brackets are text): the others need no trying.
            quoted = [token for token in candidates if self.token_text.piece(token)[:1] == b'"']
            candidates = quoted or candidates
        out, open_value = [], not few
        for token in candidates:
            if len(out) == limit:
                break
            # A turn: the grammar forces a run after it or may end there (a digit inside a number
            # or a comma inside a string is not one: nothing is forced after it).
            probe = self._matcher.deep_copy()  # tried on a copy: see _undo
            if not probe.consume_token(token):
                reason = _first_line(probe.get_error())
                raise ConstraintError(f"{self.grammar.description}: token {token} allowed, then refused ({reason})")
            if probe.is_accepting() or probe.compute_ff_tokens():
                out.append(token)
            else:
                open_value = True
        return Turns(out, closing=open_value)

    def certain(self, tokens: list[int]) -> int:
        if self._ended:
            return 0
        count = 0
        for token in tokens:
            words = np.flatnonzero(self._mask_bits())
            if len(words) != 1 or int(self._bits[words[0]]).bit_count() != 1 or not self.allows(token):
                break
            self.advance(token)
            count += 1
        if count:
            self.rollback(count)
        return count

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole match (the reply may end here, or has)."""
        return bool(self._ended) or self._matcher.is_accepting()


def _validate(grammar: Grammar, tokenizer: object | None) -> None:
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar.source, tokenizer)
    if failed:
        raise GrammarError(f"{grammar.description}: {_first_line(messages[0])}")


def _first_line(message: str) -> str:
    """llguidance's message in one line, its detail kept: a bad `pattern` comes as regex-syntax's
    report over four lines (a headline, the pattern, a caret under the fault, the error), whose
    first line alone said only "regex parse error:"."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "the grammar engine gave no reason"
    if len(lines) >= 3 and lines[0].endswith(":") and lines[-1].startswith("error: "):
        return f"{lines[0][:-1]} in {lines[1]!r}: {lines[-1].removeprefix('error: ')}"
    joined = " ".join(lines)
    return joined if len(joined) <= _MOST_REASON_CHARS else joined[: _MOST_REASON_CHARS - 1] + "…"


_MOST_REASON_CHARS = 300  # a one-line error, not a page


SCALAR_TYPES = frozenset({"null", "boolean", "integer", "number", "string"})


def _check_recursion(schema: dict, name: str) -> None:
    """GrammarError when a `$ref` recurses with no way to end: every instance would be infinite
    (a ref to itself through required properties, or refs that only point at each other). A
    recursive schema with an exit (optional children, empty arrays allowed, a type that may be
    null) is fine. Malformed parts are skipped here: llguidance names them."""

    def resolve(pointer: str) -> Any:
        if not pointer.startswith("#"):
            return None  # remote: llguidance reports it
        node: Any = schema
        for part in filter(None, pointer[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None  # missing: llguidance reports it
        return node

    budget = [10_000]  # nodes visited; a schema built to blow the walk up is left to llguidance's limits

    def listed(node: dict, key: str) -> list:
        value = node.get(key)
        return value if isinstance(value, list) else []

    def finite(node: Any, open_refs: frozenset[str]) -> bool:
        """Whether `node` has an instance of finite size, not going through `open_refs` again."""
        budget[0] -= 1
        if not isinstance(node, dict) or budget[0] < 0:
            return True
        types = node.get("type")
        if "enum" in node or "const" in node or (isinstance(types, str) and types in SCALAR_TYPES):
            return True
        if isinstance(types, list) and SCALAR_TYPES.intersection(t for t in types if isinstance(t, str)):
            return True
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in open_refs:
                return False
            target = resolve(ref)
            if target is not None and not finite(target, open_refs | {ref}):
                return False
        if not all(finite(part, open_refs) for part in listed(node, "allOf")):
            return False
        for key in ("anyOf", "oneOf"):
            options = listed(node, key)
            if options and not any(finite(part, open_refs) for part in options):
                return False
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        for required in listed(node, "required"):
            if isinstance(required, str) and required in properties and not finite(properties[required], open_refs):
                return False
        min_items = node.get("minItems", 0)
        if isinstance(min_items, int) and min_items > 0:
            prefix = listed(node, "prefixItems")
            if any(not finite(item, open_refs) for item in prefix[:min_items]):
                return False
            if min_items > len(prefix) and not finite(node.get("items"), open_refs):
                return False
        return True

    try:
        ends = finite(schema, frozenset())
    except RecursionError:
        raise GrammarError(f"{name}: its $ref chains nest too deeply") from None
    if not ends:
        raise GrammarError(f"{name}: it recurses through $ref with no way to end (no finite JSON matches it)")
