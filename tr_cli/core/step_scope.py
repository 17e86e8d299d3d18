"""Which forward passes verify drafted tokens, for weights that treat a prompt differently.

A forward over several tokens is either a prompt (transformers' `generate` prefills one in a
single call, tr in chunks) or a decoding step verifying a draft, whose every row stands for a
token `generate` computes alone, one per forward. models/weights.py's `+bf16` modes run prompts on
bfloat16 weights and single tokens on quantized ones, so a step's rows must take the quantized
path too: the decoder runs its steps inside `decoding_step()`, and the layers ask
`in_decoding_step()`. A context variable, so threads (the server's worker, a test) keep their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_IN_STEP: ContextVar[bool] = ContextVar("tr_decoding_step", default=False)


@contextmanager
def decoding_step() -> Iterator[None]:
    """Forwards inside verify drafted tokens: one row per token, each as if computed alone."""
    token = _IN_STEP.set(True)
    try:
        yield
    finally:
        _IN_STEP.reset(token)


def in_decoding_step() -> bool:
    return _IN_STEP.get()
