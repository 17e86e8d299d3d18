"""The recycled store's index: earlier conversations' continuations of the context's tail."""

from __future__ import annotations

import torch

from tr_cli.core.drafters import StoreLookupDrafter
from tr_cli.core.drafters.continuation_tree import Continuation
from tr_cli.core.recycled_store import ORDERS, RecycledStore


def brute_force(docs: list[list[int]], context: list[int], depth: int) -> set[tuple[int, tuple[int, ...]]]:
    """Every (match length, continuation) for the longest order in ORDERS that matches anywhere."""
    for n in reversed(ORDERS):
        if len(context) < n:
            continue
        found = set()
        for doc in docs:
            for end in range(n - 1, len(doc) - 1):
                if doc[end - n + 1 : end + 1] == context[-n:]:
                    found.add((n, tuple(doc[end + 1 : end + 1 + depth])))
        if found:
            return found
    return set()


def test_continuations_match_a_brute_force_search():
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, 6, (int(n),), generator=g).tolist() for n in (40, 90, 25, 60)]
    store = RecycledStore(vocab_size=6)
    for stamp, doc in enumerate(docs):
        assert store.add(doc, stamp)
    for trial in range(30):
        context = torch.randint(0, 6, (10,), generator=torch.Generator().manual_seed(100 + trial)).tolist()
        got = store.continuations(context, depth=5, limit=1000)
        want = brute_force(docs, context, 5)
        longest = {(c.match, c.tokens) for c in got if c.match == (max(c.match for c in got) if got else 0)}
        assert longest == want
        # Longest match first, and a continuation never runs into the next conversation.
        assert [c.match for c in got] == sorted((c.match for c in got), reverse=True)


def test_conversations_indexed_as_they_join_answer_as_one_index_over_all():
    """Each conversation that joins is indexed on its own at the next lookup (one more part); the
    answers, order and limits included, equal those of a store indexed whole, through removals
    (capacity, a conversation re-read from its start) and past the number of parts that merges them."""
    g = torch.Generator().manual_seed(5)
    growing = RecycledStore(vocab_size=5, capacity=900)
    contexts = [torch.randint(0, 5, (9,), generator=g).tolist() for _ in range(12)]
    for stamp in range(40):
        doc = torch.randint(0, 5, (int(torch.randint(10, 60, (1,), generator=g)),), generator=g).tolist()
        if stamp % 13 == 12:  # the last conversation continued: it replaces its earlier part
            doc = growing.documents[-1].tokens.tolist() + doc
        assert growing.add(doc, stamp)
        whole = RecycledStore(vocab_size=5, capacity=900)
        for old in growing.documents:
            whole.add(old.tokens.tolist(), 0)
        for context in contexts:
            for limit in (1, 3, 50):
                assert growing.continuations(context, 6, limit) == whole.continuations(context, 6, limit)


def test_parts_merge_as_a_binary_counter_carries():
    """Conversations of one size joining one by one: the newest parts merge while the one before is
    at most twice the newcomer, so 64 of them leave at most log2(64) + 1 parts, never one per
    conversation, and the answers stay those of a store indexed whole."""
    g = torch.Generator().manual_seed(9)
    docs = [torch.randint(0, 7, (30,), generator=g).tolist() for _ in range(64)]
    growing = RecycledStore(vocab_size=7)
    most = 0
    for stamp, doc in enumerate(docs):
        growing.add(doc, stamp)
        growing.continuations(doc[:9], 4, 2)  # a lookup indexes what joined
        most = max(most, len(growing._parts))
    assert 2 <= most <= 7
    whole = RecycledStore(vocab_size=7, documents=list(growing.documents))
    for doc in docs[::7]:
        assert growing.continuations(doc[3:12], 5, 8) == whole.continuations(doc[3:12], 5, 8)


def test_latest_first_and_no_crossing_between_conversations():
    store = RecycledStore(vocab_size=50)
    store.add([1, 2, 3, 4, 5, 6, 7, 8], stamp=1)
    store.add([9, 9, 9, 9, 1, 2, 30, 31], stamp=2)
    got = store.continuations([7, 1, 2], depth=4, limit=2)
    assert got == [Continuation(2, (30, 31)), Continuation(2, (3, 4, 5, 6))]
    assert store.continuations([6, 7, 8], depth=3, limit=4) == []  # 8 ends its conversation


def test_capacity_evicts_the_oldest_and_bad_documents_are_refused():
    store = RecycledStore(vocab_size=100, capacity=20)
    assert not store.add([1, 2, 3], stamp=1)  # too short to be worth keeping
    assert not store.add([1, 2, 3, 4, 5, 6, 7, 100], stamp=1)  # an id outside the vocabulary
    for stamp in range(4):
        assert store.add(list(range(stamp * 10, stamp * 10 + 8)), stamp)
    assert [d.stamp for d in store.documents] == [2, 3] and store.total_tokens == 16
    assert store.continuations([20, 21], depth=2, limit=1) == [Continuation(2, (22, 23))]
    assert store.continuations([0, 1], depth=2, limit=1) == []
    assert len(store.added) == 4  # what this process added, for the merge on save


def test_a_conversation_continued_replaces_its_earlier_part():
    store = RecycledStore(vocab_size=100)
    store.add(list(range(10)), stamp=1)
    store.add(list(range(14)), stamp=2)  # the same chat, re-read from its start and continued
    assert [d.tokens.tolist() for d in store.documents] == [list(range(14))] and store.total_tokens == 14
    store.add(list(range(20, 30)), stamp=3)
    store.add(list(range(12)), stamp=4)  # not a continuation of the last one: both kept
    assert store.total_tokens == 14 + 10 + 12 and len(store.added) == 3


def test_store_drafter_learns_conversations_when_they_end():
    store = RecycledStore(vocab_size=100)
    drafter = StoreLookupDrafter(store)
    drafter.extend([5, 6, 7, 8, 9, 10, 11, 12, 13])
    assert drafter.propose(13) is None  # the current conversation is not in the store yet
    drafter.reset()
    assert store.total_tokens == 9
    drafter.extend([40, 6, 7])
    draft = drafter.propose(7)
    assert draft.tokens.tolist()[:4] == [7, 8, 9, 10]
    # A copy drafts from the same text but keeps its own additions.
    twin = store.copy()
    twin.add(list(range(50, 60)), stamp=5)
    assert store.total_tokens == 9 and twin.total_tokens == 19
