"""When to stop: EOS ids, an exact new-token budget, and optional stop strings."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .errors import TrError

# Generated tokens decoded in front of the new ones when looking for a stop string that spans steps.
_STOP_TAIL_TOKENS = 16


def context_room(max_positions: int | None, held: int, new_input: int, max_depth: int) -> int | None:
    """How many tokens a reply may still have when the decoder holds `held` tokens and is fed
    `new_input` more: a step's draft reaches `max_depth` positions past the cache, and every
    position must stay inside the model's context. None: the model states no limit. Below 1:
    the prompt leaves no room for a reply."""
    if max_positions is None:
        return None
    return max_positions - held - new_input - max_depth


class NoRoomForReply(TrError):
    """The model's context cannot hold the input and a reply of at least one token (with the
    positions a step's drafts reach past it). Each surface words its own advice."""

    def __init__(self, context: int, held: int, new_input: int, max_depth: int) -> None:
        self.context, self.held, self.new_input, self.max_depth = context, held, new_input, max_depth
        super().__init__(
            f"the model's context holds {context:,} tokens: {held + new_input:,} are taken by the conversation "
            f"and {max_depth} more are needed for drafts, which leaves no room for a reply"
        )


def reply_budget(wanted: int, max_positions: int | None, held: int, new_input: int, max_depth: int) -> int:
    """How many tokens a reply may have: `wanted`, clamped to what the context leaves
    (context_room). Raises NoRoomForReply when that is less than one. Every surface (generate,
    chat, serve, bench) asks this before any forward: a prompt past the context would run for
    minutes and produce garbage."""
    room = context_room(max_positions, held, new_input, max_depth)
    if room is None:
        return wanted
    if room < 1:
        raise NoRoomForReply(max_positions, held, new_input, max_depth)
    return min(wanted, room)


@dataclass(frozen=True)
class StopCondition:
    max_new_tokens: int
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.stop_strings and self.decode is None:
            raise ValueError("stop strings need a decode function (the tokenizer's)")

    @classmethod
    def build(
        cls,
        max_new_tokens: int,
        eos_token_ids: Iterable[int] | int | None = None,
        stop_strings: Iterable[str] = (),
        decode: Callable[[list[int]], str] | None = None,
    ) -> StopCondition:
        if eos_token_ids is None:
            eos = frozenset()
        elif isinstance(eos_token_ids, int):
            eos = frozenset([eos_token_ids])
        else:
            eos = frozenset(int(t) for t in eos_token_ids)
        return cls(max_new_tokens, eos, tuple(s for s in stop_strings if s), decode)

    def cut(self, generated: list[int], new: list[int]) -> tuple[int, str | None]:
        """How many of `new` to emit after `generated`, and why generation ends (None: go on)."""
        limit = min(len(new), self.max_new_tokens - len(generated))
        tail = generated[-_STOP_TAIL_TOKENS:]
        for j in range(1, limit + 1):
            if new[j - 1] in self.eos_token_ids:
                return j, "eos"
            if self.stop_strings:
                text = self.decode(tail + new[:j])
                if any(s in text for s in self.stop_strings):
                    return j, "stop_string"
        if len(generated) + limit >= self.max_new_tokens:
            return limit, "length"
        return limit, None
