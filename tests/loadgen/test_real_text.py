"""Real text after the unique tag: prose from pydoc_data.topics, code from the standard library."""

from __future__ import annotations

import asyncio

import pytest

from servedeck.loadgen import sized_requests, synthetic_requests
from servedeck.loadgen import texts


def chars_count(text: str) -> int:
    # four characters a token, rounded up: not linear in words, so sizing by characters must search
    return (len(text) + 3) // 4


def test_corpora_are_what_python_ships():
    prose, code = texts.corpus("prose"), texts.corpus("code")
    assert len(prose) > 100_000 and "statement" in prose
    assert len(code) > 1_000_000 and "def " in code and "import " in code
    with pytest.raises(ValueError, match="random, prose, code"):
        texts.corpus("poetry")


@pytest.mark.parametrize("content", ["prose", "code"])
def test_real_text_prompts_are_unique_slices_sized_exactly(content):
    specs = asyncio.run(sized_requests(300, 8, 6, lambda t: _async(chars_count(t)), content=content, seed=3))
    assert len({s.prompt[:8] for s in specs}) == 6  # the tag comes first: no shared opening
    assert len({s.prompt[9:60] for s in specs}) == 6  # then a slice from a different place each
    assert all(s.prompt_tokens_expected == 300 and chars_count(s.prompt) == 300 for s in specs)
    body = specs[0].prompt[9:]
    assert body in texts.corpus(content) + texts.corpus(content)[:2000]  # a real slice, unaltered


def test_code_slices_start_at_a_line():
    spec = next(synthetic_requests(200, 8, content="code", seed=1, nonce="n"))
    start = spec.prompt[9:]
    corpus = texts.corpus("code")
    at = corpus.find(start[:200])
    assert at == 0 or corpus[at - 1] == "\n"


def test_seed_reproduces_real_text_and_a_new_nonce_changes_the_tag():
    a = [s.prompt for s in synthetic_requests(100, 4, n=3, seed=5, nonce="x", content="prose")]
    b = [s.prompt for s in synthetic_requests(100, 4, n=3, seed=5, nonce="x", content="prose")]
    c = [s.prompt for s in synthetic_requests(100, 4, n=3, seed=5, nonce="y", content="prose")]
    assert a == b and all(x[:8] != y[:8] and x[9:] == y[9:] for x, y in zip(a, c))


def test_piece_wraps_round_the_corpus():
    text = texts.corpus("prose")
    assert texts.piece("prose", len(text) - 5, 10) == text[-5:] + text[:5]


async def _async(n: int) -> int:
    return n
