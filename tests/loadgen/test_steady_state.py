"""A closed loop's steady state, from its records (loadgen/stats.py `steady_state`); cases chosen before the code,
from the 2026-12-06 H100 side by side (r8b, 1,024 in / 256 out, docs/gpu-runs/h100-vllm-2026-12-06):
- servedeck at 256 streams, `--duration 10s`, each request ~12 s: 256 requests, one a stream, none sent after the
  first wave ended: a single burst, warned about, with --waves 3 suggested;
- vllm bench serve at 256 streams, 768 prompts (three a stream): a steady state;
- one stream, seven requests: steady after the first;
- an open loop has no waves: no figure, no warning."""

from __future__ import annotations

from servedeck.loadgen import RequestRecord, summarize
from servedeck.loadgen.stats import steady_state


def closed_loop(streams: int, per_stream: int, e2e_s: float, spread_s: float = 0.0) -> list[RequestRecord]:
    """Each stream sends its next request when its previous one ends; stream i's requests take e2e_s + i·spread_s."""
    out = []
    for i in range(streams):
        t = 0.0
        for k in range(per_stream):
            e2e = e2e_s + i * spread_s / max(1, streams)
            out.append(RequestRecord(id=f"s{i}r{k}", kind="measured", t_target=t, t_send=t, t_first_token=t + 0.1,
                                     t_end=t + e2e, chunk_t=[t + 0.1], chunk_n=[1], output_tokens=256,
                                     streamed_tokens=1, status="ok"))
            t += e2e
    return out


def test_one_wave_of_256_twelve_second_requests_is_a_burst():
    recs = closed_loop(256, 1, 12.0, spread_s=1.0)
    st = steady_state(recs, 256)
    assert st["waves"] == 1 and st["after_first_wave"] == 0 and not st["reached"]
    s = summarize(recs, shape={"type": "closed", "concurrency": 256})
    assert s["steady_state"] == st
    burst = [w for w in s["warnings"] if "measured a single burst" in w]
    assert burst and "--waves 3 (768 requests)" in burst[0] and "256 requests over 256 streams" in burst[0]


def test_three_waves_of_256_reach_a_steady_state():
    st = steady_state(closed_loop(256, 3, 9.6, spread_s=2.0), 256)
    assert st["waves"] == 3 and st["after_first_wave"] >= 256 and st["reached"]


def test_one_stream_is_steady_after_its_first_request():
    st = steady_state(closed_loop(1, 7, 0.5), 1)
    assert st["after_first_wave"] == 6 and st["reached"]


def test_two_waves_that_overlap_the_first_are_no_steady_state_but_not_a_burst():
    recs = closed_loop(64, 2, 1.0, spread_s=1.5)  # the slowest first request ends after most second ones began
    st = steady_state(recs, 64)
    assert not st["reached"] and st["waves"] == 2
    s = summarize(recs, shape={"type": "closed", "concurrency": 64})
    assert any(w.startswith("reached no steady state") for w in s["warnings"])


def test_an_open_loop_has_no_waves():
    s = summarize(closed_loop(4, 2, 1.0), shape={"type": "open", "rate": 4.0})
    assert s["steady_state"] is None and not any("steady" in w or "burst" in w for w in s["warnings"])
