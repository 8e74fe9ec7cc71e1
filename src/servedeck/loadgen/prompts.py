"""Synthetic prompts that no prefix cache can reuse.

Every prompt starts with a tag unique to the run and the request ("9c1e04b7 "; a hash of the
run nonce, kind and index, so even the first token differs), then words drawn at random per
request: two prompts share no prefix beyond the chat template, within a run or across runs. `seed` makes the words reproducible; the run `nonce`
is fresh every time unless given, because replaying identical prompts run after run is how
prefix-cache hits leak into benchmarks (vLLM #52884). `bench --seed N` gives the nonce too
(`seeded_nonce`): the same prompts in every launch, for comparisons pair by pair; on a fresh launch
the cache is empty, on a server that already saw them the cached share says so.

What follows the tag (`content`, see texts.py): `random` common words (cache-free baselines),
`prose` or `code`, a slice of real text starting where the seed says (speculation, tokenisation).

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

from servedeck.loadgen import texts
from servedeck.loadgen.records import Kind, RequestSpec
from servedeck.loadgen.texts import Content

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
# First guesses for real text (BPE tokenizers); the server's count corrects them.
_CHARS_PER_TOKEN = {"random": DEFAULT_CHARS_PER_TOKEN, "prose": 4.4, "code": 3.4}


def chars_per_token(content: str) -> float:
    return _CHARS_PER_TOKEN[content]


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


def _body(content: Content, seed: int | None, nonce: str, kind: Kind, i: int) -> tuple[Callable[[int], str], float]:
    """(text(k), units per token): the request's body after its tag, k units long. Units are words
    for random content and characters for real text; text(k) is always a prefix of text(k + 1)."""
    if content == "random":
        words = _words(seed, nonce, kind, i, 64)

        def text(k: int) -> str:
            nonlocal words
            if k > len(words):
                words = _words(seed, nonce, kind, i, 2 * k)
            return " ".join(words[:k])

        return text, 1.0
    if content not in texts.CONTENTS:
        raise ValueError(f"content must be one of {', '.join(texts.CONTENTS)}, got {content!r}")
    start = texts.start_of(content, random.Random(f"{seed if seed is not None else nonce}/{kind}/{i}/{content}"))
    return (lambda k: texts.piece(content, start, k)), _CHARS_PER_TOKEN[content]


def synthetic_text(
    i: int, tokens: int, *, nonce: str, kind: Kind = "measured", seed: int | None = None,
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN, content: Content = "random",
) -> str:
    """Approximately `tokens` tokens: the unique tag, then random common words or real text."""
    tag = _tag(nonce, kind, i)
    target_chars = tokens * chars_per_token - len(tag)
    text, units_per_token = _body(content, seed, nonce, kind, i)
    if content == "random":
        return tag + text(max(1, round(target_chars / DEFAULT_CHARS_PER_TOKEN)))
    return tag + text(max(1, round(target_chars)))


def synthetic_requests(
    tokens: int, max_tokens: int, *, n: int | None = None, kind: Kind = "measured",
    seed: int | None = None, nonce: str | None = None,
    chars_per_token: float | None = None, content: Content = "random",
) -> Iterator[RequestSpec]:
    """Approximately sized requests, generated lazily (n=None: without end, for duration runs)."""
    if tokens < 1 or max_tokens < 1:
        raise ValueError("tokens and max_tokens must be >= 1")
    chars_per_token = chars_per_token or _CHARS_PER_TOKEN[content]
    if chars_per_token <= 0:
        raise ValueError("chars_per_token must be > 0")
    nonce = nonce or new_nonce()
    i = 0
    while n is None or i < n:
        text = synthetic_text(i, tokens, nonce=nonce, kind=kind, seed=seed, chars_per_token=chars_per_token,
                              content=content)
        yield RequestSpec(id=f"{nonce}-{kind[0]}{i}", prompt=text, max_tokens=max_tokens, kind=kind,
                          index=i, digest=digest(text))
        i += 1


async def fit_prompt(
    i: int, tokens: int, count_tokens: TokenCounter, *, nonce: str, kind: Kind = "measured",
    seed: int | None = None, max_calls: int = 16, content: Content = "random",
) -> tuple[str, int]:
    """(text, its token count): exactly `tokens` when reachable, else the closest count below.

    Text with k units (words, or characters of real text) is a prefix of text with k+1 units, so
    the count grows with k: a secant guess, then bisection between the best under and the best over.
    """
    if tokens < 1:
        raise ValueError("tokens must be >= 1")
    tag = _tag(nonce, kind, i)
    body, units_per_token = _body(content, seed, nonce, kind, i)
    return await fit_length(lambda k: tag + body(k), tokens, count_tokens, units_per_token=units_per_token,
                            max_calls=max_calls, what="unique tag")


class TooShort(ValueError):
    """The length asked is not above what the fixed part (a unique tag, the chat template) already takes."""

    def __init__(self, tokens: int, fixed: int, what: str) -> None:
        super().__init__(f"{tokens} tokens is too small for the {fixed}-token {what}")
        self.tokens, self.fixed, self.what = tokens, fixed, what


async def fit_length(
    text: Callable[[int], str], tokens: int, count_tokens: TokenCounter, *, units_per_token: float = 1.0,
    max_calls: int = 16, what: str = "fixed part",
) -> tuple[str, int]:
    """The longest text(k) the counter says is `tokens` long or just under; text(k) must be a
    prefix of text(k + 1), text(0) the part that is always there."""
    lo_k, lo_n = 0, await count_tokens(text(0))  # most units known to stay <= target
    if lo_n >= tokens:
        raise TooShort(tokens, lo_n, what)
    hi_k: int | None = None  # fewest words known to overshoot
    prev_k, prev_n = lo_k, lo_n
    k = max(1, round((tokens - lo_n) * units_per_token))  # first guess
    for _ in range(max_calls):
        n = await count_tokens(text(k))
        if n == tokens:
            return text(k), n
        if n < tokens:
            lo_k, lo_n = k, n
        else:
            hi_k = k
        slope = (n - prev_n) / (k - prev_k) if k != prev_k and n != prev_n else 1.0 / units_per_token
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
    seed: int | None = None, nonce: str | None = None, concurrency: int = 8, content: Content = "random",
) -> list[RequestSpec]:
    """`n` requests whose prompts the tokenizer says are `tokens` long (or just under)."""
    nonce = nonce or new_nonce()
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> RequestSpec:
        async with gate:
            text, count = await fit_prompt(i, tokens, count_tokens, nonce=nonce, kind=kind, seed=seed,
                                           content=content)
        return RequestSpec(id=f"{nonce}-{kind[0]}{i}", prompt=text, max_tokens=max_tokens, kind=kind,
                           prompt_tokens_expected=count, index=i, digest=digest(text))

    return list(await asyncio.gather(*(one(i) for i in range(n))))
