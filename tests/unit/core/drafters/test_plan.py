"""DraftPlan: the one parser of draft plans (--tree, --lookup, tr bench's tr:… methods), and the
drafters it builds."""

from __future__ import annotations

import pytest

from tr_cli.core import PRESETS, InvalidTree, TokenRecyclingDecoder
from tr_cli.core.drafters import ConversationLookupDrafter, DraftPlan, StoreLookupDrafter
from tr_cli.core.drafters.conversation_lookup import LOOKUP_BRANCHES
from tr_cli.core.drafters.plan import DEFAULT_LOOKUP_LENGTH, MAX_DEPTH, STORE_DEPTH
from tr_cli.core.recycled_store import RecycledStore

from tiny_models import tiny_model


def test_a_designed_tree_drafts_every_source_by_default_a_fixed_tree_none():
    auto = DraftPlan.parse("auto")
    assert auto.designed and auto.tree is None
    assert auto.depth("lookup") == DEFAULT_LOOKUP_LENGTH and auto.depth("store") == STORE_DEPTH
    assert auto.name == f"auto+lookup{DEFAULT_LOOKUP_LENGTH}+store{STORE_DEPTH}"
    paper = DraftPlan.parse("paper")
    assert paper.tree == PRESETS["paper"] and paper.depth("lookup") == paper.depth("store") == 0
    assert paper.name == "paper"
    assert DraftPlan.of() == auto


def test_sources_named_override_the_defaults_and_zero_turns_one_off():
    assert DraftPlan.parse("paper+lookup10").name == "paper+lookup10"
    assert DraftPlan.parse("paper+lookup").depth("lookup") == DEFAULT_LOOKUP_LENGTH
    assert DraftPlan.parse("auto+lookup0").name == f"auto+store{STORE_DEPTH}"
    assert DraftPlan.parse("auto+store0+lookup3").name == "auto+lookup3"
    assert DraftPlan.parse("none+store").name == f"none+store{STORE_DEPTH}"
    assert DraftPlan.parse("auto").with_depth("lookup", 4).depth("lookup") == 4


def test_a_tree_file_keeps_its_own_plus_signs(tmp_path):
    spec = tmp_path / "my+tree.json"
    spec.write_text('{"name": "mine", "paths": [[0], [0, 0], [1]]}')
    plan = DraftPlan.parse(f"{spec}+lookup2")
    assert plan.tree.name == "mine" and plan.tree.size == 3 and plan.depth("lookup") == 2


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "no tree named"),
        ("+lookup4", "no tree named"),
        ("papr", "papr"),
        ("paper+lookupx", r"paper\+lookupx: unknown tree"),
        (f"auto+lookup{MAX_DEPTH + 1}", f"at most {MAX_DEPTH}"),
    ],
)
def test_bad_plans_say_what_is_wrong(text, words):
    with pytest.raises(InvalidTree, match=words):
        DraftPlan.parse(text)


def test_drafters_follow_the_plan_and_the_planning():
    store = RecycledStore(64)
    planned = DraftPlan.parse("auto+lookup6").drafters("cpu", store)
    assert [type(d) for d in planned] == [ConversationLookupDrafter, StoreLookupDrafter]
    assert planned[0].depth == 6 and planned[0].branches == LOOKUP_BRANCHES
    assert planned[1].store is store and planned[1].depth == STORE_DEPTH
    # Unplanned (a fixed tree), a lookup drafts one chain, verified whole.
    (chain,) = DraftPlan.parse("paper+lookup6").drafters("cpu", store)
    assert chain.branches == 1
    # No store opened: the store source has nothing to draft from.
    assert [type(d) for d in DraftPlan.parse("auto").drafters("cpu")] == [ConversationLookupDrafter]
    assert DraftPlan.parse("paper").drafters("cpu", store) == []


def test_a_decoder_drafts_from_the_plans_sources():
    model = tiny_model("llama")
    decoder = TokenRecyclingDecoder(
        model, tree=PRESETS["paper"], drafters=DraftPlan.parse("paper+lookup5").drafters("cpu")
    )
    assert decoder.describe() == "tree paper (80 nodes) + lookup 5x1"
    assert decoder.max_depth == max(PRESETS["paper"].depth, 5)
