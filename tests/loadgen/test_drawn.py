"""Lengths and pauses drawn per turn (loadgen/drawn.py): parsed from what a user types, bounded, seeded."""

from __future__ import annotations

import random

import pytest

from servedeck.errors import UsageError
from servedeck.loadgen.drawn import parse_drawn


@pytest.mark.parametrize("text, mean, low, high", [
    ("256", 256, 256, 256),
    ("uniform:128-384", 256, 128, 384),
    ("normal:256,64", 256, 64, 448),  # clipped at mean ± 3 sd
    ("exp:100", 100, 16, 461),  # clipped at its 99th percentile (100 × ln 100) and at the least allowed
])
def test_token_spreads_draw_within_their_bounds_around_their_mean(text, mean, low, high):
    d = parse_drawn(text, "--turn-tokens", least=16)
    assert (d.mean, d.low, d.high) == (mean, low, high)
    xs = [d.draw(random.Random(7)) for _ in range(1)] + [d.draw(r) for r in [random.Random(8)] for _ in range(3000)]
    assert all(low <= x <= high and x == int(x) for x in xs)
    assert abs(sum(xs) / len(xs) - mean) < 0.05 * mean + 1


def test_a_seed_draws_the_same_lengths_again():
    d = parse_drawn("uniform:10-1000", "--turn-tokens", least=1)
    assert [d.draw(random.Random(3)) for _ in range(5)] == [d.draw(random.Random(3)) for _ in range(5)]
    r1, r2 = random.Random(3), random.Random(3)
    assert [d.draw(r1) for _ in range(5)] == [d.draw(r2) for _ in range(5)]


def test_durations_take_units():
    d = parse_drawn("uniform:1s-3s", "--think-time", least=0.0, integer=False)
    assert (d.low, d.high, d.text) == (1.0, 3.0, "uniform:1s-3s")
    assert parse_drawn("exp:500ms", "--think-time", least=0.0, integer=False).mean == 0.5


@pytest.mark.parametrize("text, expect", [
    ("uniform:5", "a uniform spread is uniform:LOW-HIGH"),
    ("normal:3", "a normal spread is normal:MEAN,SD"),
    ("zipf:3", "'zipf' is not a spread"),
    ("12.5", "is not a whole number of tokens"),
    ("uniform:90-30", "the high end is below the low one"),
    ("8", "--turn-tokens must be at least 16"),
])
def test_mistakes_name_the_flag_and_what_was_expected(text, expect):
    with pytest.raises(UsageError) as e:
        parse_drawn(text, "--turn-tokens", least=16)
    assert "--turn-tokens" in e.value.message and expect in e.value.message
    assert e.value.hint
