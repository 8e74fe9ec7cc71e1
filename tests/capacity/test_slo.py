"""SLO parsing and judging (servedeck.slo): pure, on request records written out by hand."""

from __future__ import annotations

import pytest

from servedeck.errors import UsageError
from servedeck.loadgen.records import RequestRecord
from servedeck.slo import judge, parse_slo


def test_parses_every_figure_with_units():
    slo = parse_slo("ttft_p95<=2s,tpot_p95<=50ms,itl_p99<=100ms,e2e_p90<=30s,error_rate<=1%")
    got = {t.key: t.limit for t in slo.thresholds}
    assert got == {"ttft_p95": 2000.0, "tpot_p95": 50.0, "itl_p99": 100.0, "e2e_p90": 30000.0, "error_rate": 0.01}


def test_text_round_trips():
    text = "ttft_p95<=2s,tpot_p99.9<=50ms,error_rate<=0.5%"
    assert parse_slo(parse_slo(text).text).thresholds == parse_slo(text).thresholds


@pytest.mark.parametrize("text, names", [
    ("ttfx_p95<=2s", ["'ttfx'", "expected one of ttft, tpot, itl, e2e, error_rate"]),
    ("ttft_p100<=2s", ["percentile '100'", "outside (0, 100)"]),
    ("ttft_p0<=2s", ["percentile '0'", "outside (0, 100)"]),
    ("ttft_p95<=2", ["'2' has no unit", "ms, s or m"]),
    ("ttft<=2s", ["name the percentile"]),
    ("ttft_p95=2s", ["expected FIGURE_pNN<=LIMIT"]),
    ("error_rate<=0.01", ["not a percentage"]),
    ("ttft_p95<=2s,ttft_p95<=1s", ["ttft_p95 is given twice"]),
    ("ttft_p95<=2h", ["unit 'h'"]),
])
def test_bad_parts_are_refused_naming_them(text, names):
    with pytest.raises(UsageError) as e:
        parse_slo(text)
    for n in names:
        assert n in e.value.message


def _rec(i: int, ttft: float, gap: float, tokens: int = 5, status: str = "ok") -> RequestRecord:
    """A finished request sent at i seconds: first token after `ttft`, then one token every `gap`."""
    send = float(i)
    if status != "ok":
        return RequestRecord(id=f"r{i}", kind="measured", t_target=send, t_send=send, t_end=send + 1,
                             status=status, error="timed out")
    chunks = [send + ttft + k * gap for k in range(tokens)]
    return RequestRecord(id=f"r{i}", kind="measured", t_target=send, t_send=send, t_first_token=chunks[0],
                         chunk_t=chunks, chunk_n=[1] * tokens, t_end=chunks[-1], output_tokens=tokens,
                         streamed_tokens=tokens, status="ok")


def test_a_point_within_every_threshold_passes():
    recs = [_rec(i, 0.1, 0.01) for i in range(20)]
    j = judge(recs, parse_slo("ttft_p95<=200ms,tpot_p95<=20ms,itl_p99<=20ms,error_rate<=1%"))
    assert j["passed"] is True


def test_p95_passes_with_one_slow_request_in_twenty_and_fails_with_two():
    slo = parse_slo("ttft_p95<=200ms")
    one = [_rec(i, 0.1, 0.01) for i in range(19)] + [_rec(19, 5.0, 0.01)]
    two = [_rec(i, 0.1, 0.01) for i in range(18)] + [_rec(18, 5.0, 0.01), _rec(19, 5.0, 0.01)]
    assert judge(one, slo)["passed"] is True
    assert judge(two, slo)["passed"] is False


def test_a_failed_request_misses_every_threshold():
    # 2 of 20 failed: p95 of TTFT and of E2E fall on a failure, whatever the fast ones did
    recs = [_rec(i, 0.1, 0.01) for i in range(18)] + [_rec(18, 0, 0, status="error"), _rec(19, 0, 0, status="error")]
    j = judge(recs, parse_slo("ttft_p95<=10s,e2e_p95<=10s,itl_p99<=1s"))
    assert j["missed"] == ["ttft_p95", "e2e_p95", "itl_p99"]


def test_error_rate_counts_failed_requests():
    recs = [_rec(i, 0.1, 0.01) for i in range(9)] + [_rec(9, 0, 0, status="error")]
    assert judge(recs, parse_slo("error_rate<=10%"))["passed"] is True
    assert judge(recs, parse_slo("error_rate<=5%"))["passed"] is False


def test_goodput_counts_requests_meeting_every_threshold():
    # sent at 0..9 s; 3 slow first tokens, 1 error: 6 good requests over the window
    recs = [_rec(i, 0.1, 0.01) for i in range(6)] + [_rec(i, 3.0, 0.01) for i in range(6, 9)] \
        + [_rec(9, 0, 0, status="error")]
    j = judge(recs, parse_slo("ttft_p50<=1s"))
    assert j["good_requests"] == 6
    assert j["goodput_request_s"] == pytest.approx(6 / j["window_s"])


def test_binding_constraint_is_the_threshold_furthest_past_its_limit():
    recs = [_rec(i, 0.3, 0.08) for i in range(10)]  # TTFT 1.5x its limit, TPOT 4x
    j = judge(recs, parse_slo("ttft_p95<=200ms,tpot_p95<=20ms"))
    assert j["binding"] == "tpot_p95"


def test_warmup_records_are_left_out():
    warm = RequestRecord(id="w", kind="warmup", t_target=0, t_send=0, t_end=1, status="error", error="x")
    j = judge([warm] + [_rec(i, 0.1, 0.01) for i in range(5)], parse_slo("error_rate<=0%"))
    assert j["passed"] is True
