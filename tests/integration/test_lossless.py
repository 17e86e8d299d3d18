"""Token Recycling output equals transformers' greedy `generate`, token for token, in float32.

Covered per architecture: prompts shorter and longer than the sliding window, budgets of 1 to 60
tokens, EOS hit mid-generation, a warm matrix carried across prompts and an empty one, and a
second turn continuing from the KV cache of the first.
"""

import pytest

from tr_cli.core import StopCondition, TokenRecyclingDecoder
from tr_cli.core.decode import PrefillLearning, prefill_chunks
from tr_cli.core.drafters import DraftPlan
from tr_cli.core.errors import PrefillStopped

from tiny_models import ARCHITECTURES, EOS, random_prompt, reference, tiny_model


@pytest.fixture(scope="module", params=ARCHITECTURES)
def model(request):
    return tiny_model(request.param)


CASES = [(5, 1), (9, 7), (20, 40), (33, 60)]  # (prompt length, max_new_tokens); window is 12


def test_warm_matrix_matches_generate(model):
    decoder = TokenRecyclingDecoder(model)  # one decoder: the matrix carries over prompts
    accepted = 0
    for seed, (length, budget) in enumerate(CASES):
        ids = random_prompt(length, seed)
        decoder.reset()
        result = decoder.generate(ids, StopCondition.build(budget, [EOS]))
        assert result.tokens == reference(model, ids, budget)
        assert len(result.tokens) <= budget
        accepted += result.stats.step_tokens - result.stats.steps
    assert accepted > 0, "drafts were never accepted: the tree path was not exercised"


def test_empty_matrix_matches_generate(model):
    for seed, (length, budget) in enumerate(CASES):
        ids = random_prompt(length, 100 + seed)
        decoder = TokenRecyclingDecoder(model, prefill_learning=PrefillLearning.NONE)
        assert not decoder.matrix.any()
        assert decoder.generate(ids, StopCondition.build(budget, [EOS])).tokens == reference(model, ids, budget)


def test_stops_at_eos_like_generate(model):
    ids = random_prompt(25, 7)
    free = reference(model, ids, 40)
    # An EOS whose first occurrence is as late as possible, so generation stops inside a step.
    position = max(i for i in range(len(free)) if free[i] not in free[:i])
    assert position >= 3
    eos = free[position]
    decoder = TokenRecyclingDecoder(model)
    result = decoder.generate(ids, StopCondition.build(40, [eos]))
    assert result.tokens == reference(model, ids, 40, eos=eos) == free[: position + 1]
    assert result.stats.finish_reason == "eos"


def test_second_turn_continues_from_cache(model):
    first, second = random_prompt(15, 11), random_prompt(6, 12)
    decoder = TokenRecyclingDecoder(model)
    reply = decoder.generate(first, StopCondition.build(30, [EOS])).tokens
    cached = decoder.cached_length
    assert cached == len(first) + len(reply) - 1  # the last reply token is pending, not yet cached
    continued = decoder.generate(second, StopCondition.build(25, [EOS])).tokens
    assert continued == reference(model, first + reply + second, 25)
    assert decoder.tokens == first + reply + second + continued


def designed_run(model, prompts_seed: int = 200):
    """Decode repetitive prompts with a designed tree (redesigned every 3 steps) and a lookup chain;
    return (tokens, reference) pairs and the events."""
    from tr_cli.core.design.cost_model import CostModel

    cost = CostModel((1, 8, 32, 64), (0.010, 0.011, 0.014, 0.030))
    decoder = TokenRecyclingDecoder(model, cost=cost, drafters=DraftPlan.of(None, {"lookup": 6}).drafters("cpu"))
    decoder.matrix_tree.auto.every = 3
    pairs, events = [], []
    for seed, (length, budget) in enumerate(CASES):
        part = random_prompt(max(length // 3, 3), prompts_seed + seed)
        ids = (part * 6)[: length + 6]
        decoder.reset()
        result = decoder.generate(ids, StopCondition.build(budget, [EOS]), keep_events=True)
        pairs.append((result.tokens, reference(model, ids, budget)))
        events.extend(result.events[1:])
    designed_run.last_decoder = decoder
    return pairs, events


def test_designed_tree_with_lookup_chain_matches_generate(model):
    """--tree auto: a tree designed from a cost model, redesigned mid-generation, plus the prompt
    lookup chain (prompts repeat themselves, so there are proposals)."""
    pairs, events = designed_run(model)
    for got, want in pairs:
        assert got == want
    assert any(e.tree.external_size for e in events), "no step carried a lookup chain"
    matrix_trees = {(e.tree.parents[: e.tree.matrix_size + 1], e.tree.slots[: e.tree.matrix_size + 1]) for e in events}
    assert len(matrix_trees) >= 2, "the tree was never redesigned"


def test_lookup_drafts_get_accepted():
    """On a model that repeats itself the lookup's drafts are right (and output stays exact)."""
    model = tiny_model("llama")
    pairs, _ = designed_run(model)
    assert all(got == want for got, want in pairs)
    decoder_hits = designed_run.last_decoder.drafters[1].stats.hits
    assert sum(decoder_hits) > 0


@pytest.mark.parametrize("lookup", [0, 5])
def test_no_draft_tree_is_plain_decoding(lookup):
    """--tree none: one token per forward (the `ar` reference); with a lookup chain it becomes
    prompt lookup decoding on the same forward path. Both stay exact."""
    from tr_cli.core import PRESETS

    model = tiny_model("qwen2")
    decoder = TokenRecyclingDecoder(
        model, tree=PRESETS["none"], drafters=DraftPlan.of(PRESETS["none"], {"lookup": lookup}).drafters("cpu")
    )
    for seed, (length, budget) in enumerate(CASES):
        ids = (random_prompt(4, 300 + seed) * 8)[: length + 4]
        decoder.reset()
        result = decoder.generate(ids, StopCondition.build(budget, [EOS]))
        assert result.tokens == reference(model, ids, budget)
        if lookup == 0:
            assert result.stats.steps == len(result.tokens) - 1


def test_recycled_store_keeps_output_exact_stale_or_repeated(model):
    """Every source planned per step: the matrix tree, branching lookup and a store filled first
    with unrelated text (stale: its drafts are wrong) and then with the same prompts' first pass
    (a repeated workload: its drafts are right). Output equals generate's either way."""
    import torch

    from tr_cli.core.design.cost_model import CostModel
    from tr_cli.core.recycled_store import RecycledStore

    cost = CostModel((1, 8, 32, 64), (0.010, 0.011, 0.014, 0.030))
    vocab = model.get_output_embeddings().weight.shape[0]
    store = RecycledStore(vocab)
    g = torch.Generator().manual_seed(5)
    for stamp in range(4):
        store.add(torch.randint(0, vocab, (300,), generator=g).tolist(), stamp)
    decoder = TokenRecyclingDecoder(model, cost=cost, drafters=DraftPlan.of(None, {"lookup": 6}).drafters("cpu", store))
    source = decoder.drafters[2]
    for repeat in range(2):
        for seed, (length, budget) in enumerate(CASES):
            ids = random_prompt(length, 400 + seed)
            decoder.reset()  # the previous conversation joins the store
            assert decoder.generate(ids, StopCondition.build(budget, [EOS])).tokens == reference(model, ids, budget)
        if repeat == 0:
            first_pass_hits = sum(source.stats.hits)
    assert sum(source.stats.hits) > first_pass_hits, "the second pass never drafted from the first"


@pytest.mark.parametrize("keep_from", ["prompt", "reply"])
def test_rewind_to_a_shared_prefix_continues_exactly(model, keep_from):
    """A server request that shares only a prefix with the held conversation (an edited turn, a
    regenerated reply) rewinds to it: the continuation equals generate on the new whole prompt,
    with every source planned (the lookup index and the store follow the rewind)."""
    from tr_cli.core.design.cost_model import CostModel
    from tr_cli.core.recycled_store import RecycledStore

    cost = CostModel((1, 8, 32, 64), (0.010, 0.011, 0.014, 0.030))
    store = RecycledStore(model.get_output_embeddings().weight.shape[0])
    decoder = TokenRecyclingDecoder(model, cost=cost, drafters=DraftPlan.of(None, {"lookup": 6}).drafters("cpu", store))
    first = random_prompt(20, 31)
    reply = decoder.generate(first, StopCondition.build(25, [EOS])).tokens
    held = first + reply
    keep = 12 if keep_from == "prompt" else len(first) + len(reply) // 2
    new_prompt = held[:keep] + random_prompt(7, 32)
    assert decoder.shared_prefix(new_prompt) == keep
    decoder.rewind(keep)
    assert decoder.tokens == held[:keep]
    assert decoder.cached_length == keep - 1  # the last kept token is pending
    assert len(store.added) == 1  # the old conversation joined the store
    continued = decoder.generate(new_prompt[keep:], StopCondition.build(30, [EOS])).tokens
    assert continued == reference(model, new_prompt, 30)
    # Back to nothing shared: a fresh start.
    decoder.rewind(0)
    assert decoder.tokens == [] and decoder.cached_length == 0


def test_a_prefill_stopped_between_chunks_keeps_what_it_read_and_resumes_exactly():
    """A caller that stops while a long prompt is read (a server whose client left) stops before
    the next prefill chunk; the conversation then ends at the last cached token, and a request
    with the same prompt reads only the rest and decodes exactly."""
    model = tiny_model("llama")
    prompt = random_prompt(1000, 41)
    assert prefill_chunks(len(prompt)) == [(0, 500), (500, 1000)]
    decoder = TokenRecyclingDecoder(model)
    steps = decoder.steps(prompt, StopCondition.build(12, [EOS]), lambda: decoder.cached_length > 0)
    with pytest.raises(PrefillStopped) as stopped:
        next(steps)
    assert (stopped.value.read, stopped.value.total) == (500, 1000)
    assert decoder.cached_length == 500
    assert decoder.tokens == prompt[:501]  # the first token not cached is the pending one
    assert decoder.shared_prefix(prompt) == 501
    continued = decoder.generate(prompt[501:], StopCondition.build(12, [EOS])).tokens
    assert continued == reference(model, prompt, 12)
