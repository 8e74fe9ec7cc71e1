"""Which /metrics series each adapter names for telemetry, read out of a page. llama.cpp's and vLLM's
names are checked against the real engines in test_bench_telemetry.py; SGLang cannot run here, so
its names are tested on the page SGLang's production-metrics documentation prints (text only)."""

from __future__ import annotations

from servedeck.engines import get_engine
from servedeck.telemetry.series import read_series

# SGLang's documented example page (docs.sglang.io, references/production_metrics), abridged to
# the series named here plus one histogram the reader must skip
SGLANG_DOC_PAGE = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.3518979474117756e+06
sglang:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 162.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0
"""


def test_sglang_series_read_from_its_documented_page():
    names = get_engine("sglang").telemetry_series()
    got, absent = read_series(SGLANG_DOC_PAGE, names)
    assert got == {"kv_usage": 0.28, "running": 162.0, "waiting": 2826.0, "generation_tokens": 7.557572e+06}
    assert absent == []


def test_sglang_names_no_preemption_series():
    # its documentation names none; a guessed name would be sampled as absent forever
    assert "preemptions" not in get_engine("sglang").telemetry_series()


def test_series_summed_over_label_sets_and_absent_ones_named():
    page = ('vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting_by_reason{reason="capacity",model_name="m"} 9.0\n')
    got, absent = read_series(page, {"waiting": "vllm:num_requests_waiting", "running": "vllm:num_requests_running"})
    assert got == {"waiting": 5.0}  # both engine cores, and not the longer name that starts the same
    assert absent == ["running"]
