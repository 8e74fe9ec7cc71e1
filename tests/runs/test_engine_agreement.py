"""servedeck's figures against the engine's own latency histograms (vLLM's /metrics), without a server:
the histogram arithmetic (a point's change, quantiles inside buckets) and what the agreement says."""

from __future__ import annotations

import math

from servedeck.engines import get_engine
from servedeck.engines.metrics import read_histograms
from servedeck.loadgen.records import RequestRecord
from servedeck.runs.figures import bucket_quantile, histogram_agreement, point_figures

INF = math.inf

# A page in vLLM's shape: two label sets (engine cores) of one histogram are summed.
PAGE = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.2
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.6
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_a_page_is_read_by_the_adapters_names_and_summed_over_label_sets():
    h = read_histograms(PAGE, get_engine("vllm").latency_histograms)
    assert set(h) == {"ttft"}  # the only one of the adapter's histograms this page carries
    assert h["ttft"]["name"] == "vllm:time_to_first_token_seconds"
    assert h["ttft"]["count"] == 6 and abs(h["ttft"]["sum"] - 1.8) < 1e-9
    assert h["ttft"]["buckets"] == [[0.1, 1.0], [0.5, 5.0], [INF, 6.0]]


def test_an_engine_without_histograms_reads_none():
    assert read_histograms(PAGE, get_engine("llamacpp").latency_histograms) is None


def test_quantiles_interpolate_inside_a_bucket_as_prometheus_does():
    b = [[0.1, 10.0], [0.5, 30.0], [INF, 40.0]]
    assert bucket_quantile(0.25, b) == 0.1  # rank 10: the top of the first bucket
    assert abs(bucket_quantile(0.5, b) - 0.3) < 1e-12  # rank 20: halfway through (0.1, 0.5]
    assert bucket_quantile(0.99, b) == 0.5  # in +Inf's bucket: the last finite bound
    assert bucket_quantile(0.5, [[0.1, 0.0], [INF, 0.0]]) is None


def _rec(i: int, ttft: float, e2e: float, out: int = 11) -> RequestRecord:
    return RequestRecord(id=f"r{i}", kind="measured", t_target=0, t_send=0.0, t_first_token=ttft, t_end=e2e,
                         status="ok", output_tokens=out, prompt_tokens=100)


def _hist(count, total, buckets):
    return {"name": "x", "count": count, "sum": total, "buckets": buckets}


def test_only_the_measured_phase_counts_and_the_gap_is_client_minus_engine():
    before = {"ttft": _hist(5, 10.0, [[0.1, 0.0], [0.5, 2.0], [INF, 5.0]])}  # what earlier traffic left
    after = {"ttft": _hist(9, 10.8, [[0.1, 2.0], [0.5, 6.0], [INF, 9.0]])}
    recs = [_rec(i, t, 1.0) for i, t in enumerate((0.15, 0.25, 0.3, 0.4))]
    ag = histogram_agreement(before, after, recs)
    row = ag["figures"]["ttft"]
    assert row["engine"]["requests"] == 4 and abs(row["engine"]["mean_ms"] - 200.0) < 1e-9
    assert abs(row["client"]["mean_ms"] - 275.0) < 1e-9
    assert abs(row["mean_minus_engine_ms"] - 75.0) < 1e-9
    assert ag["same_requests"] is True
    # both sides read at the engine's resolution: the client's four values fall in (0.1, 0.5]
    assert 100 < row["client"]["p50_ms_binned"] <= 500


def test_different_counts_say_the_two_did_not_see_the_same_requests():
    after = {"ttft": _hist(7, 1.4, [[0.5, 7.0], [INF, 7.0]])}
    ag = histogram_agreement({}, after, [_rec(0, 0.2, 1.0)])
    assert ag["same_requests"] is False


def test_an_engine_restarted_in_between_gives_no_figure():
    before = {"ttft": _hist(9, 3.0, [[0.5, 9.0], [INF, 9.0]])}
    after = {"ttft": _hist(2, 0.4, [[0.5, 2.0], [INF, 2.0]])}
    assert histogram_agreement(before, after, [_rec(0, 0.2, 1.0)]) is None


def test_point_figures_carry_it_and_the_cached_share_says_where_it_came_from():
    recs = [_rec(0, 0.2, 1.0), _rec(1, 0.3, 1.1)]  # no cached_tokens: the server did not say per request
    point = {"engine_histograms": {"before": None, "after": None},
             "counters": {"available": True, "queried_tokens": 200.0, "hit_tokens": 0.0, "fraction": 0.0}}
    fig = point_figures(recs, point, {"workload": "chat"})
    assert fig["engine_agreement"] is None and fig["cached_fraction_source"] == "engine counters"
    [w] = [w for w in fig["warnings"] if "did not report cached tokens" in w]
    assert "comes from the engine's own prefix-cache counters" in w
