"""Log-probabilities of emitted tokens, read from the verification logits.

Each token a step emits was chosen at its parent's node (the root for the first, then the node
before it): the row of the verified logits at that node is the model's distribution for it,
exactly what one-token decoding would have computed there. These are the model's own
log-probabilities (log-softmax of the logits, before temperature or truncation), as most
OpenAI-compatible servers report them, never a draft's guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP = 20  # the OpenAI API's top_logprobs bound


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely tokens there, best first (empty when none asked)


def token_logprobs(logits: torch.Tensor, rows: list[int], tokens: list[int], top: int) -> list[TokenLogprob]:
    """For each `tokens[i]`, chosen at `logits[rows[i]]`: its log-probability and the `top` best
    (0 to MAX_TOP: the decoder's set_logprobs checks it once)."""
    index = torch.tensor(rows, device=logits.device)
    logs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    chosen = logs.gather(1, torch.tensor(tokens, device=logits.device).view(-1, 1)).view(-1).tolist()
    if top:
        values, ids = torch.topk(logs, top, dim=-1)
        alternatives = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        alternatives = [()] * len(tokens)
    return [TokenLogprob(t, lp, alt) for t, lp, alt in zip(tokens, chosen, alternatives, strict=True)]
