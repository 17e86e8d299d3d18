"""The draft steps a stream carries on request (`"tr": {"steps": true}`, serve/draft_steps.py):
each step's tree with every node's source, the accepted path, the model's own token and the
running statistics, built from a step event as the decoder yields it; and the chunk that carries
them."""

import torch

from tr_cli.core.events import GenerationStats, StepEvent, StepTimings
from tr_cli.core.tree import EXTERNAL, TreeSpec
from tr_cli.serve.draft_steps import node_sources, step_object
from tr_cli.serve.responses import Reply
from tr_cli.text.token_pieces import TokenPieces

WORDS = {10: " The", 11: " cat", 12: " dog", 13: " sat", 14: " on", 15: " mat", 16: ".", 17: "\n"}


class WordTokenizer:
    all_special_ids = []

    def decode(self, ids, **_):
        return "".join(WORDS[i] for i in ids)


PIECES = TokenPieces(WordTokenizer())

# root " The"; matrix nodes 1 " cat", 2 " dog" under the root and 3 " sat" under " cat"; a lookup
# chain 4 " cat" -> 5 " sat" -> 6 " on" under the root (EXTERNAL slots, after the matrix nodes).
TREE = TreeSpec("t", parents=(-1, 0, 0, 1, 0, 4, 5), slots=(-1, 0, 1, 0, EXTERNAL, EXTERNAL, EXTERNAL))
TOKENS = torch.tensor([10, 11, 12, 13, 11, 13, 14])


def event(accepted_nodes, bonus=15, nodes_by_source=None, new_tokens=None, finish_reason=None) -> StepEvent:
    accepted_tokens = [int(TOKENS[n]) for n in accepted_nodes]
    emitted = accepted_tokens + ([bonus] if bonus is not None else [])
    return StepEvent(
        step=4,
        tree_tokens=TOKENS,
        tree=TREE,
        accepted_nodes=list(accepted_nodes),
        accepted_tokens=accepted_tokens,
        bonus=bonus,
        new_tokens=new_tokens if new_tokens is not None else emitted,
        timings=StepTimings(draft=0.001, forward=0.02, verify=0.002, update=0.001),
        finish_reason=finish_reason,
        nodes_by_source=nodes_by_source if nodes_by_source is not None else {"matrix": (1, 2, 3), "lookup": (4, 5, 6)},
    )


def stats(new_tokens=9, steps=4, step_tokens=8, wall=0.5) -> GenerationStats:
    return GenerationStats(
        prompt_tokens=20, new_tokens=new_tokens, steps=steps, step_tokens=step_tokens, wall_seconds=wall
    )


def test_a_step_names_each_drafted_node_and_accepted_token_by_its_source():
    body = step_object(event([4, 5, 6]), stats(), PIECES)
    assert body["index"] == 4
    assert body["root"] == {"id": 10, "text": " The"}
    assert [(n["text"], n["parent"], n["source"]) for n in body["tree"]] == [
        (" cat", 0, "matrix"),
        (" dog", 0, "matrix"),
        (" sat", 1, "matrix"),
        (" cat", 0, "lookup"),
        (" sat", 4, "lookup"),
        (" on", 5, "lookup"),
    ]
    assert body["drafted"] == {"matrix": 3, "lookup": 3}
    assert body["accepted"] == [
        {"id": 11, "text": " cat", "node": 4, "source": "lookup"},
        {"id": 13, "text": " sat", "node": 5, "source": "lookup"},
        {"id": 14, "text": " on", "node": 6, "source": "lookup"},
    ]
    assert body["bonus"] == {"id": 15, "text": " mat"}
    assert body["new_tokens"] == 4
    assert body["ms"] == 24.0
    assert body["mean_accepted_tokens"] == 2.0 and body["tokens_per_second"] == 18.0


def test_the_matrix_path_is_named_matrix_and_a_stop_can_leave_no_bonus():
    body = step_object(event([1, 3], bonus=None, finish_reason="stop_string"), stats(), PIECES)
    assert [(t["text"], t["source"]) for t in body["accepted"]] == [(" cat", "matrix"), (" sat", "matrix")]
    assert body["bonus"] is None and body["new_tokens"] == 2


def test_a_node_two_sources_drafted_alike_is_named_by_the_first_and_counted_once():
    merged = {"matrix": (1, 2, 3), "lookup": (1, 3, 6, -1), "store": (4, 5)}  # -1: left out by the planner
    assert node_sources(event([1], nodes_by_source=merged)) == {
        1: "matrix",
        2: "matrix",
        3: "matrix",
        4: "store",
        5: "store",
        6: "lookup",
    }
    body = step_object(event([1, 3], nodes_by_source=merged), stats(), PIECES)
    assert body["drafted"] == {"matrix": 3, "store": 2, "lookup": 1}
    assert sum(body["drafted"].values()) == len(body["tree"])


def test_the_prefill_drafts_nothing_and_its_token_is_the_models_own():
    prefill = StepEvent(
        step=0,
        tree_tokens=None,
        tree=None,
        accepted_nodes=[],
        accepted_tokens=[],
        bonus=16,
        new_tokens=[16],
        timings=StepTimings(forward=0.05),
        finish_reason=None,
    )
    body = step_object(prefill, stats(new_tokens=1, steps=0, step_tokens=0, wall=0.05), PIECES)
    assert body["index"] == 0 and body["tree"] == [] and body["accepted"] == [] and body["drafted"] == {}
    assert body["root"] is None and body["bonus"] == {"id": 16, "text": "."}
    assert body["mean_accepted_tokens"] == 1.0  # no decoding step yet


def test_the_step_rides_on_a_chunk_only_when_given():
    reply = Reply(chat=True, model="tiny")
    step = {"index": 1}
    plain = reply.chunk("Hi")
    assert "tr" not in plain
    carried = reply.chunk("Hi", step=step)
    assert carried["tr"] == {"step": step}
    assert carried["choices"] == plain["choices"] and carried["object"] == "chat.completion.chunk"
    empty = reply.chunk(step=step)  # a step whose text is held back (a stop string may follow)
    assert empty["choices"][0]["delta"] == {} and empty["tr"] == {"step": step}
    text = Reply(chat=False, model="tiny").chunk("Hi", step=step)
    assert text["choices"][0]["text"] == "Hi" and text["tr"] == {"step": step}
