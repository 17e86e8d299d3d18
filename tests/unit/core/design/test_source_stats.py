"""Per-source acceptance statistics: a source that stops being right is priced down everywhere."""

from __future__ import annotations

import pytest

from tr_cli.core.design.source_stats import SourceStats


def test_a_stale_source_is_priced_down_in_cells_it_was_never_tried_in():
    stats = SourceStats(prior=0.4)
    sure, untried = stats.cell(1, 1.0, 8), stats.cell(3, 1.0, 2)
    before = stats.probability(untried)
    assert before == pytest.approx(0.4)  # all continuations agree: the prior itself
    # Forty wrong drafts, all in other cells.
    stats.record([sure, stats.cell(2, 0.5, 3)] * 20, [True] * 40, [False] * 40)
    assert stats.probability(sure) < 0.05
    assert stats.probability(untried) < before / 3
    assert stats.hit_rate() == 0.0


def test_a_good_source_rises_above_its_prior_and_counts_only_tried_nodes():
    stats = SourceStats(prior=0.25)
    cell = stats.cell(1, 1.0, 5)
    stats.record([cell] * 30 + [cell] * 5, [True] * 30 + [False] * 5, [True] * 30 + [True] * 5)
    assert stats.observed == 30  # untried nodes (their parent was wrong) do not count
    assert stats.probability(cell) > 0.8
    assert stats.probability(stats.cell(4, 1.0, 5)) > 0.25  # the whole source is trusted more
    twin = stats.copy()
    assert twin.probability(cell) == stats.probability(cell)
