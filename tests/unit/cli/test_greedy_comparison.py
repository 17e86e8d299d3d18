"""What `tr generate --compare` says of a greedy reply against transformers' `generate`. In a fresh
home the first bfloat16 run of SmolLM2 ("Name three colors.") parted from `generate` at a near-tie
while later runs did not (another tree, other rounding): said as bfloat16's rounding, with the
float32 check to run, not left looking like a broken guarantee."""

from tr_cli.cli.generate import greedy_comparison


def test_the_same_reply_is_identical_in_any_dtype():
    for dtype in ("float32", "bfloat16"):
        assert greedy_comparison([1, 2, 3], [1, 2, 3], dtype) == "output identical"


def test_a_float32_difference_is_only_where_it_starts():
    assert greedy_comparison([1, 2, 3], [1, 5, 3], "float32") == "output differs from token 1"


def test_a_bfloat16_difference_names_the_rounding_and_the_exact_check():
    said = greedy_comparison([1, 2, 3], [1, 2], "bfloat16")
    assert said.startswith("output differs from token 2 (bfloat16 rounds")
    assert "near-ties" in said and "--dtype float32" in said
