"""A cheap lower bound on how many tokens a text takes, so that a prompt which cannot fit the
model's context is refused before the chat template and the tokenizer spend seconds on it (an
8 MB message took 3.9 s to template and tokenize)."""

from __future__ import annotations

from collections.abc import Iterable


def longest_token_chars(tokenizer) -> int:
    """The most characters one token can stand for: the longest entry in the vocabulary. Byte-level
    vocabularies spell one byte per character and SentencePiece ones the text itself, so no token
    decodes to more characters than its entry has."""
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1)


def fewest_tokens(texts: Iterable[str], longest: int) -> int:
    """At least this many tokens hold `texts`: each character a chat template keeps lies in some
    token of at most `longest` characters (templates may trim each text's ends, so those don't count)."""
    return -(-sum(len(text.strip()) for text in texts) // max(1, longest))
