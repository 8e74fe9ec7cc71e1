"""servedeck's client, judged by the instrument (a separate process) that knows when it sent what."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from servedeck.loadgen.loop import preferred, run as run_loop

from servedeck.loadgen import (
    ClientConfig,
    ClosedLoop,
    LoadResult,
    StreamingClient,
    run_load,
    summarize_run,
    synthetic_requests,
)


async def drive(url: str, concurrency: int, n: int, max_tokens: int) -> LoadResult:
    async with StreamingClient(ClientConfig(url, model="instrument")) as client:
        await client.prewarm(concurrency)
        warm = list(synthetic_requests(32, 3, n=2, kind="warmup"))
        return await run_load(client, ClosedLoop(concurrency), list(synthetic_requests(32, max_tokens, n=n)),
                              warmup=warm)


@pytest.mark.parametrize("mode, concurrency", [("cheap", 1), ("cheap", 64), ("realistic", 16)])
def test_ttft_and_itl_match_what_the_instrument_sent(instrument_factory, mode, concurrency):
    """Against both instrument modes: "realistic" builds and json.dumps every event when due, as
    a server does, so the client has the CPU it will have against an engine, not more."""
    instrument = instrument_factory("--ttft-ms", "50", "--itl-ms", "20", "--tokens", "100",
                                    *(["--realistic"] if mode == "realistic" else []))
    res = run_loop(drive(instrument.url, concurrency, n=max(3, concurrency), max_tokens=50))  # uvloop if installed
    sent = instrument.records()
    measured = [r for r in res.records if r.kind == "measured"]
    assert measured and all(r.status == "ok" for r in measured), [r.error for r in measured]

    ttft_err, itl_err, delivery = [], [], []
    for r in measured:
        s = sent[r.id]
        got = [t + res.t0 for t in r.chunk_t]  # back to absolute perf_counter, the instrument's clock
        assert len(got) == len(s["chunk_t"]) == 50
        ttft_err.append((got[0] - s["chunk_t"][0]) * 1e3)
        delivery += [(g - w) * 1e3 for g, w in zip(got, s["chunk_t"])]
        itl_err += [((got[k] - got[k - 1]) - (s["chunk_t"][k] - s["chunk_t"][k - 1])) * 1e3 for k in range(1, 50)]

    # Causality: same clock in both processes, so no token may be seen before it was written.
    assert min(delivery) >= 0.0
    assert statistics.median(abs(x) for x in ttft_err) <= 3.0, ttft_err
    assert statistics.median(abs(x) for x in itl_err) <= 3.0

    stats = summarize_run(res)
    # The role-only first chunk the instrument sends at once is not a token: TTFT is ~50 ms, not ~0.
    assert 49.0 <= stats["ttft_ms"]["p50"] <= 80.0
    assert 19.0 <= stats["tpot_ms"]["p50"] <= 22.0
    assert stats["itl_ms"]["n"] == 49 * len(measured)
    assert stats["token_counts"]["mismatched"] == 0
    assert stats["client"]["loop"] == preferred() and res.loop == preferred()  # the self-check names the loop
