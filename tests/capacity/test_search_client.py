"""The search when a step is client-bound: a client short of CPU is measured again with more client processes (as
many as the host's free cores allow), a busy host's lag with the same count; cases chosen before the code:
- plain SmolLM2 on a 16-CPU H100 host (2026-12-06): c=16 short with one process, 13.2 cores free of vLLM's work:
  c=16 again with 13 processes, which clears it, and the search goes on with 13;
- a 2-core box with no free core: one more process (2), short again: the search stops, saying it tried 2;
- a busy host (client at a few % of a core, lag that can move the SLO's figures): the same count again, and the
  note says more processes would not help."""

from __future__ import annotations

from servedeck.workloads.search import Resolution, Search, SearchOptions


def point(passed: bool, kind: str | None = None, free: float | None = None, procs: int = 1) -> dict:
    return {"passed": passed, "binding": "ttft_p90", "missed": [] if passed else ["ttft_p90"], "ttft_p50_ms": 100.0,
            "client_bound": kind is not None, "client_kind": kind, "client_procs": procs,
            "client_reasons": [f"{kind} reason"] if kind else [], "host": {"free_cores": free},
            "thresholds": [{"key": "ttft_p90", "value": 100.0, "passed": passed}]}


def drive(measure, **opts) -> tuple[dict, list[int]]:
    """`measure(load, procs)`; returns the result and the client processes each step was measured with."""
    o = dict(start=16, cap=64, cap_reason="--max 64", resolution=Resolution(0.1))
    o.update(opts)
    s = Search(SearchOptions(**o))
    used = []
    while (load := s.next_load()) is not None:
        used.append(s.procs)
        s.tell(load, measure(load, s.procs))
    return s.result(), used


def test_a_short_client_is_measured_again_with_the_free_cores_and_keeps_them():
    r, used = drive(lambda load, procs: point(load <= 32, kind="short" if procs == 1 else None, free=13.2,
                                              procs=procs))
    assert used[:3] == [1, 13, 13]
    assert [s["client_procs"] for s in r["steps"][:2]] == [1, 13]
    assert r["client_procs"]["count"] == 13 and "13.2 cores free" in r["client_procs"]["why"]
    assert r["verdict"] == "found" and r["capacity"] == 32
    assert any("short of CPU" in n and "13 client processes" in n for n in r["notes"])


def test_short_again_with_more_processes_stops_and_says_how_many():
    r, used = drive(lambda load, procs: point(True, kind="short", free=0.3, procs=procs), start=4, cap=4)
    assert used == [1, 2] and r["verdict"] == "client-bound"
    assert "the second time with 2 client processes" in r["notes"][-1]
    assert "no free core" in r["client_procs"]["why"]


def test_a_busy_hosts_lag_is_measured_again_with_the_same_processes():
    r, used = drive(lambda load, procs: point(True, kind="lag", free=0.0, procs=procs), start=4, cap=4)
    assert used == [1, 1] and r["verdict"] == "client-bound"
    assert "more client processes would not help" in r["notes"][0]
