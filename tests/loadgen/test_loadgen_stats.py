"""Figures against records whose answers were worked out by hand."""

from __future__ import annotations

import json

import pytest

from servedeck.loadgen import RequestRecord, Slo, Thresholds, summarize


def rec(id, t_send, chunks, t_end, out=None, prompt=None, cached=None, status="ok", kind="measured", lag=0.0):
    t = [c[0] for c in chunks]
    n = [c[1] for c in chunks]
    return RequestRecord(
        id=id, kind=kind, t_target=t_send - lag, t_send=t_send, t_first_byte=t_send + 0.001,
        t_first_token=t[0] if t else None, chunk_t=t, chunk_n=n, t_end=t_end, output_tokens=out,
        streamed_tokens=sum(n), prompt_tokens=prompt, cached_tokens=cached, status=status,
        error=None if status == "ok" else "boom",
    )


A = rec("a", 0.0, [(0.100, 1), (0.120, 1), (0.160, 2), (0.190, 3)], 0.200, out=7, prompt=100, cached=0, lag=0.002)
B = rec("b", 1.0, [(1.050, 1), (1.060, 1), (1.070, 1)], 1.080, out=3, prompt=2000, cached=0)
C = rec("c", 2.0, [(2.010, 1), (2.030, 1)], 2.030, out=2, prompt=2000, cached=1500)  # a prefix-cache hit
D = rec("d", 3.0, [], 3.5, status="error")
W = rec("w", -1.0, [(-0.9, 1)], -0.8, out=1, kind="warmup")
RECORDS = [W, A, B, C, D]


def test_latencies_tpot_and_itl_with_multi_token_chunks():
    s = summarize(RECORDS)
    assert s["counts"] == {"records": 5, "warmup": 1, "measured": 4, "ok": 3, "error": 1, "cancelled": 0,
                           "ok_without_content": 0}
    assert s["ttft_ms"]["n"] == 3 and s["ttft_ms"]["p50"] == pytest.approx(50.0)
    # TPOT = (e2e − ttft) / (out − 1): A (200−100)/6, B (80−50)/2, C (30−10)/1
    assert sorted([s["tpot_ms"]["min"], s["tpot_ms"]["p50"], s["tpot_ms"]["max"]]) == pytest.approx(
        [15.0, 100 / 6, 20.0])
    # ITL: A's chunks of 1, 2, 3 tokens after gaps of 20, 40, 30 ms -> 20, 20, 20, 10, 10, 10;
    # B -> 10, 10; C -> 20.
    assert s["itl_ms"]["n"] == 9
    assert s["itl_ms"]["mean"] == pytest.approx((20 * 3 + 10 * 3 + 10 * 2 + 20) / 9)
    assert s["itl_ms"]["p50"] == pytest.approx(10.0)
    assert s["e2e_ms"]["max"] == pytest.approx(200.0)
    # Window: first measured send (0.0) to last measured end (3.5).
    assert s["window_s"] == pytest.approx(3.5)
    assert s["output_tokens"] == 12 and s["output_tok_s"] == pytest.approx(12 / 3.5)
    assert s["request_s"] == pytest.approx(3 / 3.5)
    assert s["per_user_tok_s"]["max"] == pytest.approx(1000 / 15)
    json.dumps(s)  # plain JSON


def test_prefill_excludes_short_and_cached_prompts():
    p = summarize(RECORDS)["prefill_tok_s"]
    assert p["n"] == 1 and p["p50"] == pytest.approx(2000 / 0.050)  # only B
    assert p["excluded_cached"] == 1 and p["excluded_short"] == 1
    cache = summarize(RECORDS)["cache"]
    assert cache["cached_tokens"] == 1500 and cache["requests_over_threshold"] == 1
    assert cache["cached_fraction"] == pytest.approx(1500 / 4100)


def test_goodput_under_slos():
    g = summarize(RECORDS, slo=Slo(ttft_ms=60, tpot_ms=16))["goodput"]
    # A: TTFT 100 > 60. B: 50 ms, 15 ms/token: good. C: TPOT 20 > 16. D failed.
    assert g["good_requests"] == 1 and g["fraction"] == pytest.approx(1 / 4)
    assert g["request_s"] == pytest.approx(1 / 3.5)
    assert summarize(RECORDS, slo=Slo(e2e_ms=100))["goodput"]["good_requests"] == 2  # B, C


def test_client_self_check_flags_lag_and_cpu():
    s = summarize(RECORDS, cpu_s=0.5, wall_s=1.0)
    assert s["client"]["lag_ms"]["max"] == pytest.approx(2.0) and not s["client"]["client_bound"]
    s = summarize(RECORDS, cpu_s=0.95, wall_s=1.0)
    assert s["client"]["client_bound"] and "CPU" in s["client"]["reasons"][0]
    assert not summarize(RECORDS, cpu_s=0.0095, wall_s=0.01)["client"]["client_bound"]  # too short to tell
    late = [rec(f"late{i}", 5.0 + i, [(5.1 + i, 1)], 5.2 + i, out=1, lag=0.050) for i in range(2)]
    s = summarize(RECORDS + late, thresholds=Thresholds(lag_p99_ms=10))
    assert s["client"]["client_bound"] and "lag" in s["client"]["reasons"][0]
    assert s["client"]["lag_over_limit"] == 2


def test_one_late_send_alone_is_a_warning_not_client_bound():
    # Below ~100 requests p99 is the slowest request: one late wake-up must not void the point.
    late = rec("late", 5.0, [(5.1, 1)], 5.2, out=1, lag=0.050)
    s = summarize(RECORDS + [late], thresholds=Thresholds(lag_p99_ms=10))
    assert s["client"]["lag_ms"]["p99"] > 10 and s["client"]["lag_over_limit"] == 1
    assert not s["client"]["client_bound"]
    assert any("one of 5 requests was sent 50.0 ms late" in w for w in s["warnings"]), s["warnings"]
    # The same 50 ms against 10-second requests is 0.5 % of their time: not the client's pace.
    slow = [rec(f"s{i}", 10.0 * i, [(10.0 * i + 1, 1), (10.0 * i + 9, 1)], 10.0 * i + 9, out=2, lag=0.001)
            for i in range(20)]
    s = summarize(slow + [rec("l", 300.0, [(301.0, 1)], 310.0, out=1, lag=0.050)] * 2)
    assert s["client"]["lag_limit_ms"] == pytest.approx(90.0) and not s["client"]["client_bound"]


def test_token_count_disagreement_is_warned():
    spec = rec("s", 0.0, [(0.1, 1), (0.12, 1)], 0.12, out=6)  # 2 chunks, the server says 6 tokens
    s = summarize([spec])
    assert s["token_counts"]["mismatched"] == 1 and s["token_counts"]["max_abs_diff"] == 4
    assert any("disagree" in w for w in s["warnings"])
    assert s["tpot_ms"]["p50"] == pytest.approx(20 / 5)  # TPOT uses the server's count


def test_empty_and_all_failed_runs_do_not_crash():
    s = summarize([])
    assert s["ttft_ms"]["n"] == 0 and s["output_tok_s"] is None
    s = summarize([D])
    assert s["counts"]["error"] == 1 and any("failed" in w for w in s["warnings"])


def test_record_json_round_trip():
    back = RequestRecord.from_json(json.dumps(A.to_json()))
    assert back.chunk_t == pytest.approx(A.chunk_t, abs=1e-6) and back.chunk_n == A.chunk_n
    assert (back.id, back.kind, back.output_tokens, back.status) == ("a", "measured", 7, "ok")
    assert back.ttft == pytest.approx(A.ttft, abs=2e-6)
