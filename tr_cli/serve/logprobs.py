"""A reply's token log-probabilities as the API gives them: each token named by its text and exact
bytes, placed at its offset in the reply, handed out with the text that shows it (held-back text
holds its tokens back too; tokens past a stop string and special tokens such as EOS never show).
Built on the decode worker's thread, which alone uses the tokenizer while a job decodes."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.logprobs import TokenLogprob
from ..text.reply_text import ReplyText
from ..text.token_pieces import TokenPieces


@dataclass(frozen=True)
class NamedToken:
    token: str
    bytes: tuple[int, ...]
    logprob: float


@dataclass(frozen=True)
class ShownLogprob(NamedToken):
    offset: int  # where the token's text starts in the reply
    top: tuple[NamedToken, ...]  # the most likely tokens at its place, best first


class LogprobStream:
    def __init__(self, reply: ReplyText, pieces: TokenPieces) -> None:
        self.reply = reply
        self.pieces = pieces
        self.entries: list[TokenLogprob] = []
        self.given = 0

    def add(self, entries: list[TokenLogprob] | None) -> None:
        self.entries.extend(entries or ())

    def shown(self) -> tuple[ShownLogprob, ...]:
        """Those of the tokens the text sent since the last call shows."""
        upto = self.reply.tokens_shown()
        out = self._named(self.given, upto)
        self.given = max(self.given, upto)
        return out

    def all_shown(self) -> tuple[ShownLogprob, ...]:
        return self._named(0, self.reply.tokens_shown())

    def _named(self, start: int, stop: int) -> tuple[ShownLogprob, ...]:
        return tuple(
            self._shown(i, self.entries[i])
            for i in range(start, stop)
            if self.entries[i].token not in self.pieces.special
        )

    def _name(self, token: int, logprob: float) -> NamedToken:
        return NamedToken(self.pieces.text(token), tuple(self.pieces.bytes(token)), logprob)

    def _shown(self, index: int, entry: TokenLogprob) -> ShownLogprob:
        named = self._name(entry.token, entry.logprob)
        top = tuple(self._name(token, logprob) for token, logprob in entry.top)
        return ShownLogprob(named.token, named.bytes, named.logprob, self.reply.start(index), top)
