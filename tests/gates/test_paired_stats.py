"""The paired accuracy statistics (report/accuracy.py), pure: McNemar's exact test, Newcombe's paired
interval, and the pairing of samples by id and prompt digest."""

from __future__ import annotations

import random

import pytest

from servedeck.report.accuracy import mcnemar_exact, newcombe_paired, paired


def _side(correct: list[bool], digest: str = "d") -> dict:
    return {f"q{i}": {"id": f"q{i}", "prompt_digest": f"{digest}{i}", "correct": c} for i, c in enumerate(correct)}


def test_mcnemar_exact_is_the_binomial_tail_of_the_discordant_pairs():
    # 10 discordant pairs, all one way: 2 × 0.5^10
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar_exact(5, 5) == pytest.approx(1.0)
    assert mcnemar_exact(0, 0) == 1.0


def test_newcombe_interval_covers_the_true_difference_95_percent_of_the_time():
    rng = random.Random(7)
    trials, hits = 2000, 0
    for _ in range(trials):
        t = [0, 0, 0, 0]  # both, lost, gained, neither
        for _ in range(120):
            a = rng.random() < 0.6
            b = a if rng.random() < 0.7 else rng.random() < 0.5
            t[0 if a and b else 1 if a else 2 if b else 3] += 1
        _, low, high = newcombe_paired(*t)
        hits += low <= (0.7 * 0.6 + 0.3 * 0.5) - 0.6 <= high
    assert 0.93 <= hits / trials <= 0.97


def test_newcombe_interval_holds_its_estimate_and_stays_in_range():
    d, low, high = newcombe_paired(0, 30, 0, 0)  # every pair lost
    assert d == -1.0 and low == -1.0 and -1.0 < high < 0


def test_a_large_loss_is_named_with_its_interval_and_p():
    a = _side([True] * 30 + [False] * 10)
    b = _side([False] * 12 + [True] * 18 + [False] * 10)
    x = paired([a], [b])
    assert x.pairs == 40 and x.lost == 12 and x.gained == 0
    assert x.distinguishable and x.text.startswith("B lost 30.0 points [")
    assert "(paired, 40 samples, p = 0.000488)" in x.text


def test_a_small_change_is_no_difference_distinguishable():
    a = _side([True] * 20 + [False] * 20)
    b = _side([True] * 19 + [False] + [True] + [False] * 19)
    x = paired([a], [b])
    assert not x.distinguishable and x.text.startswith("no difference distinguishable (B +0.0 points")


def test_samples_whose_prompts_differ_are_not_paired():
    a = _side([True] * 10)
    b = _side([False] * 10, digest="other")
    assert paired([a], [b]) is None


def test_launch_i_pairs_with_launch_i():
    a1, a2 = _side([True] * 5), _side([False] * 5)
    b1, b2 = _side([True] * 5), _side([False] * 5)
    x = paired([a1, a2], [b1, b2])
    assert x.pairs == 10 and x.gained == 0 and x.lost == 0
