"""Prompt encoding with the model's chat template, and incremental detokenization for streaming."""

from __future__ import annotations


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, text: str, system: str | None = None) -> list[int]:
    """Token ids for one user turn: the chat template with a generation prompt when the model has
    one, else the plain text (plain-completion mode)."""
    return encode_conversation(tokenizer, [], text, system)


def encode_conversation(
    tokenizer, history: list[tuple[str, str]], text: str, system: str | None = None
) -> list[int]:
    """Token ids of a whole conversation ((user, reply) pairs, then the new user text), ready for
    the model's reply."""
    if has_chat_template(tokenizer):
        messages = [{"role": "system", "content": system}] if system else []
        for user, reply in history:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        messages.append({"role": "user", "content": text})
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"])
    plain = "".join(f"{user}\n{reply}\n" for user, reply in history) + text
    return list(tokenizer.encode((system + "\n" if system else "") + plain))


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
