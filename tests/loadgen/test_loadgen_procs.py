"""Streams split across client processes keep one schedule, and the instrument confirms the timing."""

from __future__ import annotations

import asyncio
import os

import psutil
import pytest

from servedeck.loadgen import ClientConfig, ClosedLoop, OpenLoop, summarize_run, synthetic_requests
from servedeck.loadgen.loop import preferred
from servedeck.loadgen.procs import ProcessLoadRun, split


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process(os.getpid()).children(recursive=True)
            if "spawn" in " ".join(p.cmdline())]


def test_split_shares():
    assert split(10, 4) == [3, 3, 2, 2] and split(16, 2) == [8, 8] and sum(split(257, 3)) == 257


def test_closed_loop_over_two_processes_matches_the_instrument(instrument_factory):
    inst = instrument_factory("--ttft-ms", "40", "--itl-ms", "10", "--tokens", "20", "--realistic")
    specs = list(synthetic_requests(32, 20, n=16))
    warm = list(synthetic_requests(32, 3, n=2, kind="warmup"))
    seen = []
    run = ProcessLoadRun(ClientConfig(inst.url, model="instrument"), ClosedLoop(8), specs, procs=2, warmup=warm,
                         on_record=seen.append)
    res = asyncio.run(run.run())
    assert not _children(), "client processes outlived the run"
    measured = [r for r in res.records if r.kind == "measured"]
    assert len(measured) == 16 and all(r.status == "ok" for r in measured), [r.error for r in measured]
    assert len(seen) == 18  # on_record saw every record, warm-up included, as it came in
    assert [p["requests"] for p in res.procs] == [8, 8] and [p["streams"] for p in res.procs] == [4, 4]
    assert len({p["pid"] for p in res.procs}) == 2 and os.getpid() not in {p["pid"] for p in res.procs}
    # One start for both processes: the first request of every stream targets the shared start.
    firsts = sorted(r.t_target for r in measured)[:8]
    assert all(abs(t - res.measured_start) < 1e-9 for t in firsts), (firsts, res.measured_start)

    sent = inst.records()
    for r in measured:
        s = sent[r.id]
        got = [t + res.t0 for t in r.chunk_t]  # the run clock is absolute perf_counter in every process
        assert len(got) == 20 and r.output_tokens == 20  # usage arrived in the last event
        assert got[0] >= s["chunk_t"][0]  # causality across processes: same CLOCK_MONOTONIC
        assert got[0] - s["chunk_t"][0] < 0.25

    stats = summarize_run(res)
    client = stats["client"]
    assert client["processes"] == 2 and len(client["per_process"]) == 2
    assert all(p["cpu_s"] is not None and p["wall_s"] > 0 for p in client["per_process"])
    # what tells a client short of CPU from a busy host (loadgen/pace.py): each process's wait for a core, where
    # the kernel says, and the host's cores over the measured phase
    if os.path.exists("/proc/thread-self/schedstat"):
        assert all(p["wait_s"] is not None and p["wait_s"] >= 0 for p in client["per_process"])
    assert client["host"]["cores"] == len(os.sched_getaffinity(0)) and client["host"]["free_cores"] >= 0
    assert client["loop"] == preferred()
    assert 39.0 <= stats["ttft_ms"]["p50"] <= 150.0


def test_open_loop_send_times_come_from_one_start(instrument_factory):
    inst = instrument_factory("--ttft-ms", "5", "--itl-ms", "2", "--tokens", "4")
    specs = list(synthetic_requests(16, 4, n=12))
    run = ProcessLoadRun(ClientConfig(inst.url, model="instrument"), OpenLoop(rate=40.0), specs, procs=3)
    res = asyncio.run(run.run())
    measured = sorted((r for r in res.records if r.kind == "measured"), key=lambda r: r.t_target)
    assert [r.id for r in measured] == [s.id for s in specs]  # dealt round-robin, sent in schedule order
    for j, r in enumerate(measured):
        assert r.t_target == pytest.approx(res.measured_start + j / 40.0, abs=1e-9)
        assert r.status == "ok"
    assert [p["requests"] for p in res.procs] == [4, 4, 4]
    assert res.stop_reason == "exhausted" and not _children()


def test_requests_that_cannot_be_split_are_refused():
    with pytest.raises(ValueError, match="list or a picklable"):
        ProcessLoadRun(ClientConfig("http://127.0.0.1:9", model="m"), ClosedLoop(2),
                       synthetic_requests(16, 4), procs=2)  # a generator


def test_cancelling_stops_every_process_and_keeps_the_cancelled_records(instrument):
    """Ctrl-C (task cancelled): each process cancels its in-flight requests, which come back
    recorded as "cancelled", and no process is left behind."""
    specs = list(synthetic_requests(16, 100, n=8))
    run = ProcessLoadRun(ClientConfig(instrument.url, model="instrument"), ClosedLoop(4), specs, procs=2)

    async def go() -> None:
        task = asyncio.ensure_future(run.run())
        while run.result().measured_start is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # every stream is mid-answer (each takes ~2 s)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert run.state == "cancelled" and not _children()
    res = run.result()
    assert res.stop_reason == "cancelled"
    assert sorted(r.status for r in res.records if r.kind == "measured") == ["cancelled"] * 4
