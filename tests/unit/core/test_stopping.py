"""StopCondition.cut: exact token budget, EOS (inclusive), stop strings across steps, validation."""

from __future__ import annotations

import pytest

from tr_cli.core.stopping import StopCondition


def decode(ids: list[int]) -> str:
    """Fake tokenizer: id i is the single character chr(97 + i) ('a' = 0, 'b' = 1, ...)."""
    return "".join(chr(97 + i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) - 97 for c in text]


def test_budget_exact_never_more():
    """Emitting in chunks of various sizes reaches exactly max_new_tokens, then reports 'length'."""
    for max_new in (1, 2, 5, 13):
        for chunk in (1, 3, 7, 20):
            stop = StopCondition.build(max_new)
            generated: list[int] = []
            reason = None
            while reason is None:
                new = [1] * chunk
                n, reason = stop.cut(generated, new)
                assert 0 <= n <= len(new)
                generated += new[:n]
                assert len(generated) <= max_new
            assert reason == "length"
            assert len(generated) == max_new


def test_under_budget_goes_on():
    stop = StopCondition.build(10, eos_token_ids=[99])
    assert stop.cut([1, 2], [3, 4, 5]) == (3, None)


def test_budget_reached_exactly_by_chunk():
    stop = StopCondition.build(5)
    assert stop.cut([1, 2], [3, 4, 5]) == (3, "length")
    assert stop.cut([1, 2], [3, 4, 5, 6, 7]) == (3, "length")


def test_eos_inclusive():
    """The EOS token itself is emitted, nothing after it."""
    stop = StopCondition.build(50, eos_token_ids=[2])
    assert stop.cut([5, 6], [7, 2, 8, 9]) == (2, "eos")
    assert stop.cut([], [2, 2]) == (1, "eos")


def test_eos_several_ids_and_int_form():
    stop = StopCondition.build(50, eos_token_ids=[2, 11])
    assert stop.cut([], [4, 11, 2]) == (2, "eos")
    assert StopCondition.build(50, eos_token_ids=11).cut([], [4, 11, 2]) == (2, "eos")
    assert StopCondition.build(50, eos_token_ids=None).cut([], [4, 11, 2]) == (3, None)


def test_eos_wins_over_length_on_the_last_token():
    """EOS as the last token the budget allows ends with 'eos', not 'length'."""
    stop = StopCondition.build(4, eos_token_ids=[2])
    assert stop.cut([1, 1], [1, 2, 3]) == (2, "eos")


def test_eos_beyond_budget_ignored():
    """An EOS past the budget is cut off with the rest: the reason is 'length'."""
    stop = StopCondition.build(4, eos_token_ids=[2])
    assert stop.cut([1, 1], [1, 1, 2]) == (2, "length")


def test_stop_string_within_new_tokens():
    """Cut right after the token that completes the stop string."""
    stop = StopCondition.build(50, stop_strings=["cde"], decode=decode)
    assert stop.cut(ids("ab"), ids("xcdeyz")) == (4, "stop_string")
    assert stop.cut(ids("ab"), ids("cdcd")) == (4, None)


def test_stop_string_spanning_generated_and_new():
    """The stop string starts in already generated tokens and ends in the new ones."""
    stop = StopCondition.build(50, stop_strings=["xyz"], decode=decode)
    assert stop.cut(ids("abcxy"), ids("zqq")) == (1, "stop_string")
    assert stop.cut(ids("abcx"), ids("yzq")) == (2, "stop_string")
    # Not completed yet: go on.
    assert stop.cut(ids("abcx"), ids("y")) == (1, None)


def test_stop_string_streamed_token_by_token():
    """Feeding one token at a time stops exactly where the stop string ends."""
    text = "hellostopworld"
    stop = StopCondition.build(50, stop_strings=["stop", "nothere"], decode=decode)
    generated: list[int] = []
    reason = None
    for t in ids(text):
        n, reason = stop.cut(generated, [t])
        generated += [t][:n]
        if reason:
            break
    assert reason == "stop_string"
    assert decode(generated) == "hellostop"


def test_stop_string_first_of_several_matches():
    stop = StopCondition.build(50, stop_strings=["zz", "bc"], decode=decode)
    assert stop.cut([], ids("abczz")) == (3, "stop_string")


def test_stop_string_beyond_budget_ignored():
    stop = StopCondition.build(3, stop_strings=["cd"], decode=decode)
    assert stop.cut(ids("a"), ids("bcd")) == (2, "length")


def test_eos_before_stop_string():
    stop = StopCondition.build(50, eos_token_ids=[2], stop_strings=["de"], decode=decode)
    assert stop.cut([], ids("acde")) == (2, "eos")  # 'c' is id 2
    assert stop.cut([], ids("deac")) == (2, "stop_string")


def test_empty_stop_strings_dropped():
    """Empty strings would match everything; build() drops them (and then needs no decode)."""
    stop = StopCondition.build(5, stop_strings=["", ""])
    assert stop.stop_strings == ()
    assert stop.cut([], [1, 2]) == (2, None)


@pytest.mark.parametrize("max_new", [0, -1])
def test_invalid_budget(max_new):
    with pytest.raises(ValueError):
        StopCondition.build(max_new)


def test_stop_strings_need_decode():
    with pytest.raises(ValueError):
        StopCondition.build(5, stop_strings=["x"])
    with pytest.raises(ValueError):
        StopCondition(5, frozenset(), ("x",), None)
