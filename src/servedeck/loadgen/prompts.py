"""Synthetic prompts that no prefix cache can reuse.

Every prompt starts with a tag unique to the run and the request ("9c1e04b7 "; a hash of the
run nonce, kind and index, so even the first token differs), then words drawn at random per
request: two prompts share no prefix beyond the chat template, within a run or across runs. `seed` makes the words reproducible; the run `nonce`
is fresh every time unless given, because replaying identical prompts run after run is how
prefix-cache hits leak into benchmarks (vLLM #52884). `bench --seed N` gives the nonce too
(`seeded_nonce`): the same prompts in every launch, for comparisons pair by pair; on a fresh launch
the cache is empty, on a server that already saw them the cached share says so.

Two ways to size a prompt:
  approximate  words from a list of common English words, about one token each in BPE
               tokenizers; `chars_per_token` converts the target to characters
  exact        an async `count_tokens(text) -> int` (e.g. the server's /tokenize) is asked
               until the count equals the target, or the closest count below it
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import secrets
from collections.abc import Awaitable, Callable, Iterator

from servedeck.loadgen.records import Kind, RequestSpec

TokenCounter = Callable[[str], Awaitable[int]]

# Common words that BPE vocabularies (Llama, Qwen, GPT) hold as single " word" tokens.
_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect use class control care field development role effort rate heart drug "
    "show leader light voice wife police mind price report decision son view relationship "
    "town road arm difference value building action model season society tax director "
    "position player record paper space ground form event official matter center couple site "
    "project activity star table need court oil situation cost industry figure street image "
    "phone data picture practice piece land product doctor wall patient worker news test movie "
    "north love support technology step baby computer type attention film tree source organization "
    "hair window evidence population network bank river garden stone bridge summer winter "
    "green blue small large early late young old good new first last long great little own "
    "other right big high different public bad same able open clear simple quick happy "
    "make take come give look find think tell become leave feel bring begin keep hold write "
    "stand hear play run move live believe happen provide sit lose pay meet include continue "
    "learn lead understand watch follow stop create speak read allow spend grow offer remember"
).split()

# Assumes one token per word plus its space; only the approximate mode relies on it.
DEFAULT_CHARS_PER_TOKEN = sum(len(w) + 1 for w in _WORDS) / len(_WORDS)


def new_nonce() -> str:
    return secrets.token_hex(4)


def seeded_nonce(seed: int, point: int) -> str:
    """The nonce of point `point` of a run made with `--seed seed`: the same in every launch, so two
    runs with the same seed send the same prompts point by point (and can be compared pair by pair);
    still distinct between the points of one run, so no point replays another's prompts."""
    return hashlib.blake2b(f"seed {seed}/point {point}".encode(), digest_size=4).hexdigest()


def digest(text: str) -> str:
    """A short fingerprint of a prompt's text, kept in each request record to prove two prompts equal."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _tag(nonce: str, kind: Kind, i: int) -> str:
    # Nothing shared comes first: a common "[run-id ..." opener would itself be a cached prefix.
    return hashlib.blake2b(f"{nonce}/{kind}/{i}".encode(), digest_size=4).hexdigest() + " "


def _words(seed: int | None, nonce: str, kind: Kind, i: int, n: int) -> list[str]:
    # Seeded per request (not one stream for the run) so request i is the same whichever order
    # prompts are built in; unseeded runs draw from the nonce, which is fresh per run.
    rng = random.Random(f"{seed if seed is not None else nonce}/{kind}/{i}")
    return rng.choices(_WORDS, k=max(0, n))


def synthetic_text(
    i: int, tokens: int, *, nonce: str, kind: Kind = "measured", seed: int | None = None,
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
) -> str:
    """Approximately `tokens` tokens: the unique tag, then random common words."""
    tag = _tag(nonce, kind, i)
    target_chars = tokens * chars_per_token - len(tag)
    n_words = max(1, round(target_chars / DEFAULT_CHARS_PER_TOKEN))
    return tag + " ".join(_words(seed, nonce, kind, i, n_words))


def synthetic_requests(
    tokens: int, max_tokens: int, *, n: int | None = None, kind: Kind = "measured",
    seed: int | None = None, nonce: str | None = None,
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
) -> Iterator[RequestSpec]:
    """Approximately sized requests, generated lazily (n=None: without end, for duration runs)."""
    if tokens < 1 or max_tokens < 1:
        raise ValueError("tokens and max_tokens must be >= 1")
    if chars_per_token <= 0:
        raise ValueError("chars_per_token must be > 0")
    nonce = nonce or new_nonce()
    i = 0
    while n is None or i < n:
        text = synthetic_text(i, tokens, nonce=nonce, kind=kind, seed=seed, chars_per_token=chars_per_token)
        yield RequestSpec(id=f"{nonce}-{kind[0]}{i}", prompt=text, max_tokens=max_tokens, kind=kind,
                          index=i, digest=digest(text))
        i += 1


async def fit_prompt(
    i: int, tokens: int, count_tokens: TokenCounter, *, nonce: str, kind: Kind = "measured",
    seed: int | None = None, max_calls: int = 12,
) -> tuple[str, int]:
    """(text, its token count): exactly `tokens` when reachable, else the closest count below.

    Text with k words is a prefix of text with k+1 words, so the count grows with k: a
    secant guess, then bisection between the best under and the best over.
    """
    if tokens < 1:
        raise ValueError("tokens must be >= 1")
    tag = _tag(nonce, kind, i)
    words = _words(seed, nonce, kind, i, tokens + 16)

    def text(k: int) -> str:
        nonlocal words
        if k > len(words):
            words = _words(seed, nonce, kind, i, 2 * k)
        return tag + " ".join(words[:k])

    lo_k, lo_n = 0, await count_tokens(tag)  # most words known to stay <= target
    if lo_n >= tokens:
        raise ValueError(f"{tokens} tokens is too small for the {lo_n}-token unique tag")
    hi_k: int | None = None  # fewest words known to overshoot
    prev_k, prev_n = lo_k, lo_n
    k = tokens - lo_n  # first guess: one token per word
    for _ in range(max_calls):
        n = await count_tokens(text(k))
        if n == tokens:
            return text(k), n
        if n < tokens:
            lo_k, lo_n = k, n
        else:
            hi_k = k
        slope = (n - prev_n) / (k - prev_k) if k != prev_k and n != prev_n else 1.0
        guess = k + round((tokens - n) / slope)
        prev_k, prev_n = k, n
        upper = hi_k - 1 if hi_k is not None else guess
        if lo_k + 1 > upper:
            break  # adjacent word counts straddle the target: take the one below
        # Inside the bracket, so every call narrows it: lo_k < k < hi_k.
        k = min(max(guess, lo_k + 1), upper)
    return text(lo_k), lo_n


async def sized_requests(
    tokens: int, max_tokens: int, n: int, count_tokens: TokenCounter, *, kind: Kind = "measured",
    seed: int | None = None, nonce: str | None = None, concurrency: int = 8,
) -> list[RequestSpec]:
    """`n` requests whose prompts the tokenizer says are `tokens` long (or just under)."""
    nonce = nonce or new_nonce()
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> RequestSpec:
        async with gate:
            text, count = await fit_prompt(i, tokens, count_tokens, nonce=nonce, kind=kind, seed=seed)
        return RequestSpec(id=f"{nonce}-{kind[0]}{i}", prompt=text, max_tokens=max_tokens, kind=kind,
                           prompt_tokens_expected=count, index=i, digest=digest(text))

    return list(await asyncio.gather(*(one(i) for i in range(n))))
