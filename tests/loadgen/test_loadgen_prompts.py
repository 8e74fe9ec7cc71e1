"""Synthetic prompts: unique from their first characters, sized roughly or exactly."""

from __future__ import annotations

import asyncio

import pytest

from servedeck.loadgen import fit_prompt, sized_requests, synthetic_requests


def fake_count(text: str) -> int:
    # Not one token per word: long words count twice, so exact sizing has to search.
    return sum(2 if len(w) > 6 else 1 for w in text.split())


def test_prompts_differ_from_the_first_characters():
    measured = list(synthetic_requests(200, 16, n=50))
    warm = list(synthetic_requests(200, 16, n=5, kind="warmup"))
    firsts = {s.prompt[:8] for s in measured + warm}
    assert len(firsts) == 55  # no shared opening, so no shared cached prefix
    assert {s.kind for s in warm} == {"warmup"}
    other_run = list(synthetic_requests(200, 16, n=50))
    assert not {s.prompt for s in measured} & {s.prompt for s in other_run}  # fresh nonce per run


def test_seed_and_nonce_reproduce_prompts():
    a = [s.prompt for s in synthetic_requests(50, 4, n=3, seed=1, nonce="abcd")]
    b = [s.prompt for s in synthetic_requests(50, 4, n=3, seed=1, nonce="abcd")]
    assert a == b


def test_approximate_size_in_words():
    s = next(synthetic_requests(1000, 4))
    assert 900 <= len(s.prompt.split()) <= 1100  # one word per token, by assumption


@pytest.mark.parametrize("target", [17, 100, 1000])
def test_fit_prompt_exact_or_just_below(target):
    calls = 0

    async def count(text: str) -> int:
        nonlocal calls
        calls += 1
        return fake_count(text)

    text, n = asyncio.run(fit_prompt(3, target, count, nonce="n1"))
    assert n == fake_count(text)
    assert target - 1 <= n <= target  # a two-token word may straddle the target
    assert calls <= 13


def test_sized_requests_record_their_size():
    async def count(text: str) -> int:
        return fake_count(text)

    specs = asyncio.run(sized_requests(64, 8, 5, count))
    assert len(specs) == 5 and len({s.prompt for s in specs}) == 5
    assert all(s.prompt_tokens_expected == fake_count(s.prompt) for s in specs)


def test_refuses_a_size_below_the_tag():
    async def count(text: str) -> int:
        return 5

    with pytest.raises(ValueError, match="too small"):
        asyncio.run(fit_prompt(0, 3, count, nonce="n"))


def test_a_seed_names_the_same_prompt_set_in_every_launch_and_a_new_one_per_point():
    from servedeck.loadgen.prompts import digest, seeded_nonce

    launch1 = [list(synthetic_requests(50, 4, n=3, seed=9, nonce=seeded_nonce(9, p))) for p in (0, 1)]
    launch2 = [list(synthetic_requests(50, 4, n=3, seed=9, nonce=seeded_nonce(9, p))) for p in (0, 1)]
    assert [[(s.index, s.digest) for s in pt] for pt in launch1] == [[(s.index, s.digest) for s in pt] for pt in launch2]
    assert all(s.digest == digest(s.prompt) for pt in launch1 for s in pt)
    assert not {s.prompt for s in launch1[0]} & {s.prompt for s in launch1[1]}  # points never share prompts
    assert seeded_nonce(9, 0) != seeded_nonce(10, 0)
