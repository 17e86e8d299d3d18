"""A reply's text as it streams, cut before its first stop string (the OpenAI API's `stop`).

Deltas never contain text that may turn out to belong to a stop string: the end of the text that
could still grow into one is held back until the next tokens decide. The final text is the
tokenizer's decoding of every token, so bytes of a character left incomplete mid-stream are never
lost, and it equals the streamed deltas joined.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from .streaming import IncrementalDecoder


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string starts in `text`; None when none occurs."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def open_stop_tail(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that a stop string starts with (it may still complete)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class ReplyText:
    """Text deltas of a growing token list that are safe to send, and the final text."""

    def __init__(self, tokenizer, stops: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self._decoder = IncrementalDecoder(tokenizer)
        self._text = ""  # what the incremental decoder returned so far
        self._sent = 0
        self.stopped = False  # a stop string was found: nothing more is sent
        self._final: str | None = None  # the whole text, once finished
        self._starts: list[int] = []  # where each token's text starts in the text

    def push(self, tokens: list[int]) -> str:
        """Take new tokens; return the text that can be sent now."""
        if self.stopped:
            return ""
        for token in tokens:  # one at a time: where each token's text starts
            self._starts.append(len(self._text))
            self._text += self._decoder.push([token])
        cut = first_stop(self._text, self.stops)
        if cut is not None:
            self.stopped = True
            end = cut
        else:
            end = len(self._text) - open_stop_tail(self._text, self.stops)
        return self._advance(end)

    def finish(self) -> str:
        """The rest of the text once generation ended (held-back text, incomplete bytes)."""
        self._final = self.text()
        return self._advance(len(self._final), self._final)

    def text(self) -> str:
        """The whole reply: every token decoded, cut before the first stop string."""
        if self._final is not None:
            return self._final
        full = self.tokenizer.decode(self._decoder.tokens, skip_special_tokens=True)
        cut = first_stop(full, self.stops)
        return full if cut is None else full[:cut]

    def start(self, index: int) -> int:
        """Where the text of the `index`-th token pushed starts in the reply."""
        return self._starts[index]

    def tokens_shown(self) -> int:
        """How many leading tokens have text in what was sent so far (after `finish`: in the whole
        reply). A token past a stop string, or with no text (EOS), is never shown."""
        return bisect_left(self._starts, self._sent)  # the starts never decrease

    def _advance(self, end: int, text: str | None = None) -> str:
        source = self._text if text is None else text
        delta = source[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return delta
