"""The `tr.step` object a stream carries when a request asks for it (`"tr": {"steps": true}`):
per decoding step, what the draft sources proposed and what the model accepted, read from the
same step events `tr chat`'s live view draws (core/events.py), each token by id and text.

A node two sources drafted alike (the planner merges them) is named by the first source in the
decoder's order (the matrix first); `drafted` counts it once, under that source.
"""

from __future__ import annotations

from ..core.events import GenerationStats, StepEvent
from ..text.token_pieces import TokenPieces

UNKNOWN_SOURCE = "draft"  # a node no placement names (not expected: every drafter has a placement)


def _token(pieces: TokenPieces, token: int) -> dict:
    return {"id": token, "text": pieces.text(token)}


def node_sources(event: StepEvent) -> dict[int, str]:
    """Each draft node's source (its tree index to Drafter.name), the first name winning."""
    sources: dict[int, str] = {}
    for name, nodes in event.nodes_by_source.items():
        for node in nodes:
            if node > 0:
                sources.setdefault(node, name)
    return sources


def step_object(event: StepEvent, stats: GenerationStats, pieces: TokenPieces) -> dict:
    """The step as JSON: its index (0: the prefill, which drafts nothing and emits the first
    token as `bonus`), the draft tree (`root`, then `tree`: per node its token, parent index, 0
    being the root, and source), how many nodes each source drafted, the accepted path (tokens
    with their node and source), the model's own `bonus` token after it (null when a stop cut the
    step short), how many tokens the step emitted, its milliseconds, and the reply's running MAT
    and tokens per second (GenerationStats' definitions, the prefill included)."""
    body: dict = {
        "index": event.step,
        "root": None,
        "tree": [],
        "drafted": {},
        "accepted": [],
        "bonus": _token(pieces, event.bonus) if event.bonus is not None else None,
        "new_tokens": len(event.new_tokens),
        "ms": round(event.timings.total * 1e3, 3),
        "mean_accepted_tokens": round(stats.mean_accepted_tokens, 4),
        "tokens_per_second": round(stats.tokens_per_second, 3),
    }
    if event.tree is None or event.tree_tokens is None:  # the prefill
        return body
    tokens = event.tree_tokens.tolist()
    sources = node_sources(event)
    drafted: dict[str, int] = {}
    tree = []
    for node in range(1, len(tokens)):
        source = sources.get(node, UNKNOWN_SOURCE)
        drafted[source] = drafted.get(source, 0) + 1
        tree.append({**_token(pieces, tokens[node]), "parent": event.tree.parents[node], "source": source})
    body["root"] = _token(pieces, tokens[0])
    body["tree"] = tree
    body["drafted"] = drafted
    body["accepted"] = [
        {**_token(pieces, token), "node": node, "source": sources.get(node, UNKNOWN_SOURCE)}
        for node, token in zip(event.accepted_nodes, event.accepted_tokens, strict=True)
    ]
    return body
