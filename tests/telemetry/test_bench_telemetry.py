"""Telemetry beside real bench points: llama.cpp (SmolLM2, --metrics as servedeck renders it) and
vLLM's CPU build. No GPU here: the GPU source says it is unavailable and why, and the point runs."""

from __future__ import annotations

import json

import pytest

from telemetrykit import run_bench
from servedeck.workloads.points import BenchSpec
from servedeck.fsio import read_jsonl
from servedeck.loadgen import ClosedLoop
from servedeck.runs import load

pytestmark = [pytest.mark.engine]


def _spec(concurrency: int = 2, requests: int = 4) -> BenchSpec:
    return BenchSpec(workload="chat", shapes=(ClosedLoop(concurrency),), input_tokens=64, output_tokens=24,
                     requests=requests, warmup=1)


def _engine_samples(folder) -> list[dict]:
    return [ln for ln in read_jsonl(folder / "telemetry.jsonl") if ln["source"] == "engine" and ln["kind"] == "sample"]


@pytest.mark.llamacpp
def test_llamacpp_bench_point_writes_telemetry_and_figures_rebuild_from_it(campaign_config, llama, monkeypatch):
    monkeypatch.setenv("SERVEDECK_TELEMETRY_ENGINE_S", "0.2")  # a tiny point: several samples in it
    out = run_bench(campaign_config, "smollm2", _spec(), gate_mode=False)
    folder = out.folder
    lines = read_jsonl(folder / "telemetry.jsonl")
    start = next(ln for ln in lines if ln["source"] == "engine" and ln["kind"] == "start")
    # the adapter's names, as the real llama-server serves them (no KV-usage series in this build)
    assert start["series"] == {"running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred",
                               "prefix_hits": "llamacpp:prompt_tokens_cached_total",
                               "generation_tokens": "llamacpp:tokens_predicted_total",
                               "spec_drafts": "llamacpp:spec_decode_num_drafts_total",
                               "spec_accepted": "llamacpp:spec_decode_num_accepted_tokens_total"}
    samples = _engine_samples(folder)
    assert len(samples) >= 3
    assert not any(s.get("absent") for s in samples)  # every named series is on the page
    assert max(s["running"] for s in samples) >= 1  # the engine was seen busy with the point's requests
    gen = [s["generation_tokens"] for s in samples]
    assert gen == sorted(gen) and gen[-1] > gen[0]  # tokens generated while sampled
    gpu = [ln for ln in lines if ln["source"] == "gpu"]
    assert [g["kind"] for g in gpu] == ["unavailable"]  # no GPU on this machine: said once, nothing sampled
    assert "NVIDIA driver" in gpu[0]["reason"]
    end = next(ln for ln in lines if ln["source"] == "engine" and ln["kind"] == "end")
    assert end["samples"] == len(samples) and end["errors"] == 0
    summary = json.loads((folder / "summary.json").read_text())
    written = summary["points"][0]["figures"]["telemetry"]
    assert written["sampled"] is True and written["engine"]["max_running"] >= 1
    assert written["gpu"]["unavailable"] == gpu[0]["reason"]
    assert load(folder)["points"][0]["figures"]["telemetry"] == written  # rebuilt from the files: the same


@pytest.mark.llamacpp
def test_llamacpp_requests_joined_to_engine_state_at_arrival(campaign_config, llama, monkeypatch):
    monkeypatch.setenv("SERVEDECK_TELEMETRY_ENGINE_S", "0.1")
    out = run_bench(campaign_config, "smollm2", _spec(concurrency=2, requests=6), gate_mode=False)
    tele = load(out.folder)["points"][0]["figures"]["telemetry"]
    arrivals = tele["arrivals"]
    assert arrivals["requests"] == 6
    assert arrivals["joined"] >= 4  # the first may go out before the first sample lands
    assert sum(g["requests"] for g in arrivals["ttft_by_waiting"]) == arrivals["joined"]


@pytest.mark.vllm
def test_vllm_bench_point_samples_kv_usage_and_queue(campaign_config, vllm, monkeypatch):
    monkeypatch.setenv("SERVEDECK_TELEMETRY_ENGINE_S", "0.2")
    out = run_bench(campaign_config, "smollm2-vllm", _spec(), gate_mode=False)
    lines = read_jsonl(out.folder / "telemetry.jsonl")
    start = next(ln for ln in lines if ln["source"] == "engine" and ln["kind"] == "start")
    assert start["series"]["kv_usage"] == "vllm:kv_cache_usage_perc"
    assert start["series"]["preemptions"] == "vllm:num_preemptions_total"
    samples = _engine_samples(out.folder)
    absent = {a for s in samples for a in s.get("absent") or []}
    # every series but speculation's is on the real page (vLLM registers those only when it speculates)
    assert absent == {"spec_drafts", "spec_accepted"}, absent
    assert all(k in samples[0] for k in ("kv_usage", "running", "waiting", "preemptions", "prefix_hits",
                                         "generation_tokens"))
    assert max(s["kv_usage"] for s in samples) > 0  # the KV cache held the point's requests
    assert all(0 <= s["kv_usage"] <= 1 for s in samples)  # a share, not a percentage
    tele = load(out.folder)["points"][0]["figures"]["telemetry"]
    assert tele["engine"]["peak_kv_usage"] > 0


@pytest.mark.llamacpp
def test_engine_without_metrics_the_point_runs_and_telemetry_says_why(tmp_path, engines_ready, monkeypatch):
    from ports import free_port
    from tests.conftest import stop_everything
    from servedeck.workloads.session import Outcome, measured, run as bench
    from servedeck.init import render_starter
    from servedeck.loadgen.loop import run as run_loop
    from servedeck.modelsfile import load as load_models

    # metrics = false: servedeck renders no --metrics, so this real llama-server serves no /metrics page
    text = render_starter().replace("port = 8081", f"port = {free_port()}", 1) \
        .replace("args = { parallel = 4 }", "args = { parallel = 2, metrics = false }", 1)
    path = tmp_path / "models.toml"
    path.write_text(text)
    # a home of its own: the session's shared smollm2 (with --metrics) lives in the campaign home
    home = tmp_path / "own-home"
    home.mkdir()
    monkeypatch.setenv("SERVEDECK_HOME", str(home))
    out = Outcome()
    try:
        with measured(load_models(path), "smollm2", True, out) as target:  # started for this test, stopped after
            run_loop(bench(target, _spec(requests=2), gate_mode=False, outcome=out))
    finally:
        stop_everything(home)
    summary = json.loads((out.folder / "summary.json").read_text())
    point = summary["points"][0]
    assert point["status"] == "ok" and point["figures"]["counts"]["ok"] == 2  # the load ran regardless
    why = point["telemetry"]["not_sampled"]["engine"]
    assert "/metrics answered 501" in why or "/metrics answered 404" in why
    assert "--metrics" in why  # and what turns it on
    assert point["figures"]["telemetry"]["engine"]["unavailable"] == why
