"""A quantile read from an engine's histogram is said at the histogram's resolution (issue 47 item 4), pure.

The case the 2026-12-06 H100 run showed: vLLM's queue-time histogram (buckets 0.3, 0.5, 0.8, 1 s, ... +Inf)
over requests that each waited about 0.02 ms. Its p50, interpolated linearly inside the first bucket as
Prometheus's histogram_quantile does, is 150 ms: a figure no request came near. What the histogram knows is
that half the requests waited at most 300 ms; its mean (sum / count) is exact: 0.02 ms.
"""

from __future__ import annotations

import math

from servedeck.loadgen.records import RequestRecord
from servedeck.report.render import engine_agreement_line
from servedeck.report.text import quantile_text
from servedeck.runs.figures import bucket_of, bucket_quantile, histogram_agreement

VLLM_QUEUE_BOUNDS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                     240.0, 480.0, 960.0, 1920.0, 7680.0, math.inf]


def _queue(n: int, each_s: float) -> dict:
    return {"name": "vllm:request_queue_time_seconds", "count": float(n), "sum": n * each_s,
            "buckets": [[le, float(n)] for le in VLLM_QUEUE_BOUNDS]}


def test_the_interpolated_p50_is_the_middle_of_the_first_bucket():
    buckets = _queue(80, 0.00002)["buckets"]
    assert bucket_quantile(0.5, buckets) == 0.15
    assert bucket_of(0.5, buckets) == (0.0, 0.3)


def test_a_quantile_in_a_bucket_wider_than_its_precision_is_said_as_its_bucket():
    assert quantile_text(150.0, (0.0, 300.0)) == "≤ 300 ms"
    assert quantile_text(650.0, (500.0, 800.0)) == "500–800 ms"
    assert quantile_text(7680000.0, (7680000.0, math.inf)) == "> 7,680 s"
    assert quantile_text(12000.0, (10000.0, 15000.0)) == "10–15 s"


def test_a_bucket_within_the_figures_precision_gives_the_figure():
    # a bucket 0.05 ms wide read at 0.1 ms: the interpolation is as good as the figure's last digit
    assert quantile_text(1.23, (1.2, 1.25)) == "1.2 ms"


def test_the_engines_quantiles_carry_their_buckets():
    got = histogram_agreement({"queue": _queue(0, 0.0)}, {"queue": _queue(80, 0.00002)}, [])
    eng = got["figures"]["queue"]["engine"]
    assert (round(eng["mean_ms"], 6), eng["p50_ms"], eng["p50_bucket_ms"]) == (0.02, 150.0, [0.0, 300.0])


def test_the_line_says_the_mean_is_exact_and_the_quantile_its_bucket():
    got = histogram_agreement({"queue": _queue(0, 0.0)}, {"queue": _queue(80, 0.00002)}, [])
    line = engine_agreement_line(got)
    assert "engine queue mean 0.0 ms (engine; exact: sum / count), p50 ≤ 300 ms (its bucket)" in line
    assert "150" not in line


def test_the_clients_binned_p50_is_said_as_its_own_bucket():
    # the engine's TTFT p50 falls in (0.1, 0.5]; the client's four values in (0.5, 1]: each side its bucket
    before = {"ttft": {"name": "x", "count": 0.0, "sum": 0.0, "buckets": [[0.1, 0.0], [0.5, 0.0], [1.0, 0.0],
                                                                          [math.inf, 0.0]]}}
    after = {"ttft": {"name": "x", "count": 4.0, "sum": 1.2, "buckets": [[0.1, 0.0], [0.5, 4.0], [1.0, 4.0],
                                                                         [math.inf, 4.0]]}}
    recs = [RequestRecord(id=f"r{i}", kind="measured", t_target=0, t_send=0.0, t_first_token=t, t_end=1.5,
                          status="ok", output_tokens=11, prompt_tokens=100) for i, t in enumerate((0.6, 0.7, 0.8, 0.9))]
    row = histogram_agreement(before, after, recs)["figures"]["ttft"]
    assert (row["engine"]["p50_bucket_ms"], row["client"]["p50_bucket_ms_binned"]) == ([100.0, 500.0], [500.0, 1000.0])
    line = engine_agreement_line(histogram_agreement(before, after, recs))
    assert "TTFT mean 750 ms client / 300 ms engine (exact: sum / count); p50 500–1,000 ms / 100–500 ms in the " \
           "engine's buckets" in line
