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
        """Take new tokens; return the text they complete. Only an incomplete UTF-8 sequence at
        the very end waits (it reads as U+FFFD until its last byte arrives), never the complete
        characters before it."""
        self.tokens.extend(tokens)
        text = self._window_text()
        stable = text.rstrip("\ufffd")
        delta = stable[self._emitted :]
        self._emitted = max(self._emitted, len(stable))
        # Slide the window forward once it is long (keeping a few tokens of left context), but
        # not while a character is incomplete: its bytes would be skipped.
        if len(stable) == len(text) and len(self.tokens) - self._start > 64:
            self._start = len(self.tokens) - 8
            self._emitted = len(self._window_text())
        return delta

    def finish(self) -> str:
        """The rest once no more tokens come: an incomplete sequence at the end, decoded as the
        tokenizer decodes it, so the deltas add up to the decoding of every token."""
        text = self._window_text()
        delta = text[self._emitted :]
        self._emitted = len(text)
        return delta

    def _window_text(self) -> str:
        return self.tokenizer.decode(self.tokens[self._start :], skip_special_tokens=True)

    def text(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)
