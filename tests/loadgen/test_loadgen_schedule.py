"""Load shapes and run bookkeeping, mostly with a fake client so timing is the schedule's own."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from time import perf_counter

import numpy as np
import pytest

from servedeck.loadgen import (
    ClientConfig,
    ClosedLoop,
    LoadRun,
    OpenLoop,
    RequestRecord,
    RequestSpec,
    StreamingClient,
    run_load,
    synthetic_requests,
)


class FakeClient:
    """Takes `seconds` per request; ids in `hang` never finish; `block` ids stall the loop."""

    def __init__(self, seconds: float = 0.005, hang: set[str] = frozenset(), block: dict[str, float] | None = None):
        self.seconds, self.hang, self.block = seconds, hang, block or {}
        self.in_flight = self.max_in_flight = 0

    async def send(self, spec: RequestSpec, rec: RequestRecord, t0: float) -> None:
        rec.t_send = perf_counter() - t0
        if spec.id in self.block:
            time.sleep(self.block[spec.id])  # noqa: ASYNC251 -- a client hogging its event loop, on purpose
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(3600 if spec.id in self.hang else self.seconds)
        finally:
            self.in_flight -= 1
        rec.t_first_token = rec.t_end = perf_counter() - t0
        rec.chunk_t, rec.chunk_n, rec.streamed_tokens, rec.status = [rec.t_end], [1], 1, "ok"


def specs(n: int | None, kind: str = "measured") -> list[RequestSpec] | Iterator[RequestSpec]:
    def make(i: int) -> RequestSpec:
        return RequestSpec(id=f"{kind[0]}{i}", prompt=f"{kind} prompt {i}", max_tokens=1, kind=kind)

    return [make(i) for i in range(n)] if n is not None else map(make, itertools.count())


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_no_request_is_sent_before_its_time_on_either_loop(loop):
    """uvloop's timers round a delay to whole milliseconds and fired up to 0.42 ms early in 172 of 400
    sleeps of 1-20 ms here (2026-12-04); asyncio's never did. The schedule sleeps the remainder again."""
    from servedeck.loadgen.loop import run

    res = run(run_load(FakeClient(), OpenLoop(rate=300.0, arrivals="poisson", seed=3), specs(300)), loop=loop)
    early = [r.t_target - r.t_send for r in res.records if r.t_send < r.t_target]
    assert len(res.records) == 300 and early == []


def test_poisson_arrivals_deliver_the_rate_and_are_seeded():
    shape = OpenLoop(rate=200.0, arrivals="poisson", seed=7)
    res = asyncio.run(run_load(FakeClient(), shape, specs(400)))
    m = sorted(res.records, key=lambda r: r.t_target)
    assert len(m) == 400 and all(r.status == "ok" for r in m)
    targeted = (len(m) - 1) / (m[-1].t_target - m[0].t_target)
    delivered = (len(m) - 1) / (max(r.t_send for r in m) - min(r.t_send for r in m))
    assert 170 <= targeted <= 230
    assert abs(delivered / targeted - 1) < 0.05  # the client kept to the timetable
    gaps = np.diff([r.t_target for r in m])
    assert 0.8 < np.std(gaps) / np.mean(gaps) < 1.2  # exponential gaps: coefficient of variation ~1
    assert np.median([r.lag for r in m]) < 0.005
    again = list(itertools.islice(OpenLoop(200.0, "poisson", seed=7).offsets(), 50))
    other = list(itertools.islice(OpenLoop(200.0, "poisson", seed=8).offsets(), 50))
    assert again == list(itertools.islice(shape.offsets(), 50)) != other


def test_gamma_arrivals_keep_the_rate_and_set_the_burstiness():
    for k in (0.25, 4.0):
        gaps = np.diff(list(itertools.islice(OpenLoop(100.0, "gamma", seed=3, burstiness=k).offsets(), 4001)))
        assert np.mean(gaps) == pytest.approx(0.01, rel=0.1)
        assert np.std(gaps) / np.mean(gaps) == pytest.approx(k ** -0.5, rel=0.15)  # CV of a gamma: 1/sqrt(k)


def test_constant_rate_sends_from_a_fixed_start_and_shows_lag():
    # Request m5 stalls the client for 80 ms: later targets must not move, their lag must show it.
    client = FakeClient(block={"m5": 0.08})
    res = asyncio.run(run_load(client, OpenLoop(rate=100.0), specs(20)))
    m = sorted(res.records, key=lambda r: r.t_target)
    start = m[0].t_target
    for i, r in enumerate(m):
        assert r.t_target - start == pytest.approx(i / 100.0, abs=1e-9)
    assert m[6].lag > 0.05  # sent late, and the record says so
    assert m[-1].lag < 0.01  # caught up afterwards: the schedule did not drift


def test_closed_loop_keeps_n_in_flight_and_targets_the_previous_end():
    client = FakeClient(seconds=0.01)
    res = asyncio.run(run_load(client, ClosedLoop(4), specs(40)))
    assert len(res.records) == 40 and client.max_in_flight == 4
    ends = {round(r.t_end, 9) for r in res.records}
    later = [r for r in res.records if r.t_target > res.measured_start + 1e-6]
    assert len(later) == 36 and all(round(r.t_target, 9) in ends for r in later)
    assert res.stop_reason == "exhausted"


def test_what_the_first_host_reading_costs_is_paid_before_the_clock_starts(monkeypatch):
    """host_cores's first call imports psutil: 20-55 ms in a fresh client process, and on an H100 host
    (2026-12-06) every client process's first request went out that late, which made points client-bound.
    A first call that takes 0.2 s here must not delay any measured request."""
    from servedeck.loadgen import schedule

    real, calls = schedule.host_cores, []

    def slow_first(*a, **k):
        calls.append(perf_counter())
        if len(calls) == 1:
            time.sleep(0.2)  # the first call's import, as a fresh process pays it
        return real(*a, **k)

    monkeypatch.setattr(schedule, "host_cores", slow_first)
    res = asyncio.run(run_load(FakeClient(seconds=0.01), ClosedLoop(2), specs(6)))
    lags = [r.t_send - r.t_target for r in res.records if r.kind == "measured"]
    assert len(lags) == 6 and len(calls) >= 2
    assert max(lags) < 0.1, lags  # not 0.2 s: the slow first reading came before the measured phase


def test_duration_limit_stops_sending():
    res = asyncio.run(run_load(FakeClient(seconds=0.05), ClosedLoop(2), specs(None), duration_s=0.3))
    assert res.stop_reason == "duration"
    assert 8 <= len(res.records) <= 16
    assert max(r.t_send for r in res.records) - res.measured_start < 0.3


def test_request_count_limit():
    res = asyncio.run(run_load(FakeClient(), OpenLoop(500.0), specs(None), max_requests=25))
    assert len(res.records) == 25 and res.stop_reason == "requests"


def test_warmup_is_separate_and_marked():
    seen: list[RequestRecord] = []
    res = asyncio.run(run_load(FakeClient(), ClosedLoop(2), specs(6), warmup=specs(3, "warmup"), on_record=seen.append))
    assert [r.kind for r in seen] == ["warmup"] * 3 + ["measured"] * 6
    assert res.measured_start >= max(r.t_end for r in seen[:3])
    with pytest.raises(ValueError, match="warm-up prompt"):
        reused = [RequestSpec(id="x", prompt="warmup prompt 0", max_tokens=1)]
        asyncio.run(run_load(FakeClient(), ClosedLoop(1), reused, warmup=specs(1, "warmup")))


def test_cancel_keeps_finished_records_and_marks_in_flight_cancelled():
    seen: list[RequestRecord] = []
    client = FakeClient(seconds=0.01, hang={"m3", "m4"})

    async def go() -> LoadRun:
        run = LoadRun(client, ClosedLoop(2), specs(10), on_record=seen.append)
        task = asyncio.ensure_future(run.run())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return run

    run = asyncio.run(go())
    by_id = {r.id: r for r in run.records}
    assert [by_id[i].status for i in ("m0", "m1", "m2")] == ["ok"] * 3
    assert by_id["m3"].status == by_id["m4"].status == "cancelled"
    assert len(run.records) == 5 and {r.id for r in seen} == set(by_id)  # on_record saw every one
    assert run.result().stop_reason == "cancelled" and run.state == "cancelled"


def test_cancel_mid_stream_with_the_real_client(instrument):
    async def go() -> LoadRun:
        async with StreamingClient(ClientConfig(instrument.url, model="m")) as client:
            quick = [RequestSpec(id=f"q{i}", prompt=f"q{i}", max_tokens=2) for i in range(2)]
            slow = [RequestSpec(id=f"s{i}", prompt=f"s{i}", max_tokens=100) for i in range(4)]
            run = LoadRun(client, ClosedLoop(2), quick + slow)
            task = asyncio.ensure_future(run.run())
            await asyncio.sleep(0.6)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return run

    run = asyncio.run(go())
    by_id = {r.id: r for r in run.records}
    assert by_id["q0"].status == by_id["q1"].status == "ok"
    cancelled = [r for r in run.records if r.status == "cancelled"]
    assert len(cancelled) == 2 and all(0 < r.streamed_tokens < 100 for r in cancelled)
    assert set(by_id) == {"q0", "q1", "s0", "s1"}  # nothing sent after the cancel


def test_on_record_failure_stops_the_run():
    def boom(rec: RequestRecord) -> None:
        if rec.id == "m3":
            raise OSError("disk full")

    for shape in (ClosedLoop(2), OpenLoop(200.0)):
        with pytest.raises(OSError, match="disk full"):
            asyncio.run(run_load(FakeClient(), shape, specs(None), on_record=boom))


def test_unlimited_prompts_need_no_limit_when_finite():
    res = asyncio.run(run_load(FakeClient(), ClosedLoop(3), synthetic_requests(10, 1, n=7)))
    assert len(res.records) == 7 and res.wall_s > 0 and res.cpu_s >= 0


def test_no_automatic_gc_during_the_measured_phase_only():
    """The collector is off while measured requests run (its pauses were the client's tail), on
    during warm-up, and back as it was afterwards; the run says so."""
    import gc

    seen: list[tuple[str, bool]] = []
    specs = list(synthetic_requests(16, 4, n=6))
    warm = list(synthetic_requests(16, 4, n=2, kind="warmup"))
    assert gc.isenabled()
    res = asyncio.run(run_load(FakeClient(0.002), ClosedLoop(2), specs, warmup=warm,
                               on_record=lambda r: seen.append((r.kind, gc.isenabled()))))
    assert gc.isenabled()
    assert {e for k, e in seen if k == "measured"} == {False}
    assert {e for k, e in seen if k == "warmup"} == {True}
    assert res.gc == {"quiet": True, "automatic_during_measured": False, "periodic_collections": 0, "every_s": 30.0}
    assert res.meta()["gc"] == res.gc
    off = asyncio.run(run_load(FakeClient(0.002), ClosedLoop(2), specs[:2], quiet_gc=False))
    assert off.gc == {"quiet": False}
