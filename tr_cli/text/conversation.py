"""The one way a conversation becomes tokens, for chat, bench, `tr generate` and the matrix corpus.

With a chat template the conversation is rendered by the template (with the generation prompt)
and the text is tokenized as it stands (the template writes its own special tokens). Without
one (plain-completion mode) each message is tokenized on its own and the pieces are concatenated:
the system prompt (followed by a blank line) or else the first message with the tokenizer's
special tokens, every later message as written, so a reply's text continues straight from the
prompt and the next message straight from the reply.

A decoder that already holds a conversation only needs what follows: `continuation` returns the
tokens after what it holds, or the whole conversation again when the template wrote the earlier
turns differently this time.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import UserError

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": text, ...}


class TemplateError(UserError):
    """The model's chat template refuses the conversation (its own checks, e.g. role order)."""


class Prompt(NamedTuple):
    ids: list[int]  # tokens to feed the decoder
    rebuild: bool  # True: the ids are the whole conversation (the decoder starts over)
    rendered: str  # the template's text that the ids complete ("" in plain-completion mode)


def messages_of(history: list[tuple[str, str]], text: str, system: str | None = None) -> list[Message]:
    """A conversation from (user, reply) pairs and a new user message, the system prompt first."""
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    for user, reply in history:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": text})
    return messages


class ConversationEncoder:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.templated = bool(getattr(tokenizer, "chat_template", None))

    def _tokens(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def render(self, messages: list[Message], tools: list[dict] | None = None) -> str:
        """The template's text of a conversation ending with a user message (or a tool's result),
        ready for the reply; `tools` (OpenAI's shape) for templates that describe them."""
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - jinja2's TemplateError from the template's checks, and friends
            raise TemplateError(f"the chat template rejects this conversation: {exc}") from None

    def encode(self, messages: list[Message], tools: list[dict] | None = None) -> Prompt:
        """The whole conversation (ending with a user message), ready for the model's reply."""
        if self.templated:
            text = self.render(messages, tools)
            return Prompt(self._tokens(text), True, text)
        pieces = [m["content"] + "\n\n" if m["role"] == "system" else m["content"] for m in messages]
        ids = self._tokens(pieces[0], special=True)
        for piece in pieces[1:]:
            ids += self._tokens(piece)
        return Prompt(ids, True, "")

    def continuation(self, held: str, messages: list[Message]) -> Prompt:
        """The tokens that extend a decoder holding the conversation up to the last user message
        (`held`: the text it stands for, see `held_after`); the whole conversation (rebuild) when
        the template no longer starts with that text."""
        if not self.templated:
            return Prompt(self._tokens(messages[-1]["content"]), False, "")
        text = self.render(messages)
        if text.startswith(held):
            return Prompt(self._tokens(text[len(held) :]), False, text)
        return Prompt(self._tokens(text), True, text)

    def held_after(self, prompt: Prompt, reply: list[int]) -> str:
        """The text a decoder stands for after `prompt` and the reply's tokens, special ones
        included (a template closes a finished reply with the EOS token the model emitted)."""
        return prompt.rendered + self.tokenizer.decode(reply, skip_special_tokens=False) if self.templated else ""


def encode_prompt(tokenizer, text: str, system: str | None = None) -> list[int]:
    """Token ids for one user message (and an optional system prompt), ready for the reply."""
    return ConversationEncoder(tokenizer).encode(messages_of([], text, system)).ids
