"""Incremental detokenization: the text of a growing token list, as deltas, for streaming output."""

from __future__ import annotations


class IncrementalDecoder:
    """Turns a growing token list into text deltas without splitting multi-byte characters.

    Decoding token by token drops the spaces some tokenizers attach to the next token and breaks
    characters spread over several byte tokens, so decode a short window and emit what is new.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self._start = 0  # first token of the window being decoded
        self._emitted = 0  # characters of the window's text already returned

    def push(self, tokens: list[int]) -> str:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens[self._start :], skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        delta = text[self._emitted :]
        # Slide the window forward once it is long, keeping a few tokens of left context.
        if len(self.tokens) - self._start > 64:
            self._start = len(self.tokens) - 8
            self._emitted = len(self.tokenizer.decode(self.tokens[self._start :], skip_special_tokens=True))
        else:
            self._emitted = len(text)
        return delta

    def text(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)
