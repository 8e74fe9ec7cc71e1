"""The report's decisions, pure: the frontier, verdicts, drift (no engine, no files)."""

from __future__ import annotations

import re

import numpy as np

from servedeck.report.pareto import LoadPoint, ParetoRow, frontier
from servedeck.report.stats import judge, spread


def _row(x: float, y: float, why: list[str] | None = None) -> ParetoRow:
    return ParetoRow(LoadPoint("v", "c=1", 1, "closed", "chat", [], []), x, y, "GPU", why or [])


def test_frontier_keeps_undominated_points_that_count():
    rows = [_row(10, 100), _row(20, 80), _row(15, 70), _row(30, 500, ["gate failed"]), _row(5, 100)]
    frontier(rows)
    assert [r.on_frontier for r in rows] == [True, True, False, False, False]


def test_a_shift_is_found_and_noise_is_not():
    rng = np.random.default_rng(3)
    a = rng.normal(100, 5, 30)
    faster = judge("TTFT p50", "paired", a, a * 0.85 + rng.normal(0, 1, 30), lower_is_better=True)
    assert faster.distinguishable and -0.17 < faster.change < -0.13 and faster.high < 0
    assert re.match(r"B is 1\d % faster \[1\d %, 1\d %\] \(95 %, paired bootstrap, 30 pairs\)$", faster.text)
    same = judge("TTFT p50", "paired", a, a + rng.normal(0, 1, 30), lower_is_better=True)
    assert not same.distinguishable and same.text.startswith("no difference distinguishable from noise")
    # a real but tiny change stays under the noise threshold
    tiny = judge("TPOT p50", "paired", a, a * 1.01, lower_is_better=True)
    assert not tiny.distinguishable and "noise threshold" in tiny.text
    unpaired = judge("E2E p50", "unpaired", a, rng.normal(130, 5, 30), lower_is_better=True)
    assert unpaired.distinguishable and unpaired.low < 0.30 < unpaired.high and unpaired.p_value < 0.001
    assert re.match(r"B is \d\d % slower \[.*\] \(95 %, unpaired bootstrap, n = 30 vs 30\)$", unpaired.text)
    few = judge("output tok/s", "repeats", [10.0], [12.0], lower_is_better=False)
    assert few.method == "none" and "untested" in few.text


def test_the_same_pairs_on_both_sides_are_no_difference_even_with_a_zero_among_them():
    """One request's tokens all read at once (a stalled client) gives a TPOT of exactly 0. A resample whose
    A-median is that 0 has no relative change, which made the whole interval NaN: `compare A A` said "no
    interval (the resamples were degenerate)" in a fresh-clone run, where nothing differs at all."""
    tpot_ms = [13.801, 11.09, 0.0, 10.835, 10.692, 11.008]  # that run's six TPOTs at c=1
    same = judge("TPOT p50", "paired", tpot_ms, list(tpot_ms), lower_is_better=True)
    assert same.change == 0.0
    assert (same.low, same.high) == (0.0, 0.0)
    assert not same.distinguishable
    assert same.text.startswith("no difference distinguishable from noise"), same.text


def test_repeats_give_an_interval_and_drift_is_flagged():
    s = spread([10.0, 11.0, 12.5])
    assert s.drift == "rising" and s.low < s.mean < s.high
    assert spread([10.0, 12.0, 11.0]).drift is None and spread([3.0, 2.0]).drift is None
