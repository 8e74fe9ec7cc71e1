"""Benchmarks on real servers: complete run folders, prefix-cache detection on both engines, and
agreement with llama.cpp's own timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servedeck.workloads.points import BenchSpec
from campaignkit import run_bench
from servedeck.fsio import read_jsonl
from servedeck.gates import GateSpec
from servedeck.loadgen import ClosedLoop, Slo
from servedeck.runs import load

pytestmark = [pytest.mark.engine]

RUN_FILES = ["cmd.sh", "server.log", "boot.json", "niah.log", "requests.jsonl", "summary.json", "summary.md",
             "telemetry.jsonl"]


def _point(view: dict, i: int = 0) -> dict:
    return view["points"][i]["figures"]


@pytest.mark.llamacpp
def test_chat_run_writes_a_complete_folder(campaign_config, llama):
    spec = BenchSpec(workload="chat", shapes=(ClosedLoop(1), ClosedLoop(2)), input_tokens=256, output_tokens=16,
                     duration_s=4.0, warmup=1, slo=Slo(ttft_ms=60_000, tpot_ms=5_000))
    out = run_bench(campaign_config, "smollm2", spec, gate_spec=GateSpec(context=768))
    folder = out.folder
    assert folder.name.startswith("smollm2__tp1__8k__llamacpp__")
    assert sorted(p.name for p in folder.iterdir()) == sorted(RUN_FILES)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["schema"] == 1 and summary["status"] == "ok" and summary["reason"] is None
    assert summary["versions"]["servedeck"] and summary["versions"]["python"] and summary["versions"]["engine"]
    assert summary["host"]["cpus"] >= 1 and "available" in summary["gpus"]
    # the sdist build's own version (scripts/build-llama-server.sh's VERSION file), not b0-unknown (issue 8.8)
    assert summary["versions"]["engine_version"] == Path(summary["command"][0]).with_name("VERSION").read_text().strip()
    assert all(x == round(x, 2) for x in summary["host"]["load_avg"])
    assert summary["config"]["model"]["context"] == 8192 and summary["config"]["build"]["engine"] == "llamacpp"
    assert summary["command"][0].endswith("llama-server")
    assert summary["workload"]["points"] == ["c=1", "c=2"] and summary["workload"]["duration_s"] == 4.0
    assert summary["gate"]["status"] == "passed"
    lines = read_jsonl(folder / "requests.jsonl")
    assert {ln["point"] for ln in lines} == {0, 1}
    assert sum(ln["kind"] == "warmup" for ln in lines) == 2
    view = load(folder)  # rebuilt from the files: same figures as the summary written at the time
    for i, (p, q) in enumerate(zip(view["points"], summary["points"])):
        assert p["figures"]["counts"] == q["figures"]["counts"]
        assert p["figures"]["ttft_ms"] == q["figures"]["ttft_ms"] and p["figures"]["tpot_ms"] == q["figures"]["tpot_ms"]
        assert p["figures"]["counts"]["ok"] >= 1
        # goodput counts exactly the measured requests inside both bounds
        good = 0
        for ln in lines:
            if ln["point"] != i or ln["kind"] != "measured" or ln["status"] != "ok":
                continue
            ttft = ln["t_first_token"] - ln["t_send"]
            tpot = (ln["t_end"] - ln["t_first_token"]) / (ln["output_tokens"] - 1)
            good += ttft <= 60 and tpot <= 5
        assert p["figures"]["goodput"]["good_requests"] == good
    assert view["label"] == "ok; result"
    assert "Result" in (folder / "summary.md").read_text().splitlines()[2]
    boot = json.loads((folder / "boot.json").read_text())  # the launch's facts, parsed from its boot log
    assert boot["slots"] == 4 and boot["ctx_per_slot"] == 8192
    assert boot["listening"] == f"http://127.0.0.1:{campaign_config.models['smollm2'].port}"
    # server.log is the engine's log while this run ran (the shared server booted earlier, maybe long before):
    # llama-server's own account of every request it finished, gate probes included
    assert (folder / "server.log").read_text().count("total time =") >= len(lines)


@pytest.mark.llamacpp
def test_client_procs_split_a_point_on_llama_server(campaign_config, llama):
    """--client-procs 2 against the real llama-server: both processes send, every request lands in
    requests.jsonl once, and the self-check covers each process and names the loop."""
    spec = BenchSpec(workload="chat", shapes=(ClosedLoop(2),), input_tokens=64, output_tokens=8, requests=4,
                     warmup=1, client_procs=2)
    folder = run_bench(campaign_config, "smollm2", spec, gate_mode=False).folder
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["workload"]["client_procs"] == 2
    point = summary["points"][0]
    procs = point["load"]["client_procs"]
    assert [p["requests"] for p in procs] == [2, 2] and len({p["pid"] for p in procs}) == 2
    lines = [ln for ln in read_jsonl(folder / "requests.jsonl") if ln["kind"] == "measured"]
    assert len(lines) == 4 and len({ln["id"] for ln in lines}) == 4 and all(ln["status"] == "ok" for ln in lines)
    client = point["figures"]["client"]
    assert client["processes"] == 2 and len(client["per_process"]) == 2 and client["loop"] in ("uvloop", "asyncio")
    assert point["figures"]["counts"]["ok"] == 4
    assert "client processes" in (folder / "summary.md").read_text()


@pytest.mark.llamacpp
def test_long_prompt_run_and_agreement_with_llamacpp_timings(campaign_config, llama):
    spec = BenchSpec(workload="long-prompt", shapes=(ClosedLoop(1),), prompt_tokens=1536, output_tokens=32,
                     requests=2, warmup=0)
    out = run_bench(campaign_config, "smollm2", spec, gate_mode=False)
    view = load(out.folder)
    assert view["status"] == "ok" and view["gate"]["status"] == "not run"
    assert view["label"] == "ok; no gate: not a result"
    assert "NOT A RESULT: no correctness gate" in (out.folder / "summary.md").read_text()
    lines = [ln for ln in read_jsonl(out.folder / "requests.jsonl") if ln["kind"] == "measured"]
    assert [ln["prompt_tokens"] for ln in lines] == [1536] * 2  # sized exactly by the server's tokenizer
    f = _point(view)
    assert f["prefill_tok_s"]["n"] == 2 and f["prefill_tok_s"]["excluded_cached"] == 0
    assert f["cached_fraction"] < 0.05
    ag = f["agreement"]
    assert ag["requests"] == 2
    # servedeck's TTFT holds the engine's prompt_ms plus HTTP and the first token's trip: never less
    assert 0 <= ag["ttft_minus_prompt_ms"]["p50"] < 150
    assert 0.85 < ag["prefill_ratio"]["p50"] <= 1.0
    assert 0.9 < ag["tpot_ratio"]["p50"] < 1.1
    print(f"\nllama.cpp agreement, long prompt 1536: TTFT-prompt_ms p50 {ag['ttft_minus_prompt_ms']['p50']:.1f} ms, "
          f"prefill ratio p50 {ag['prefill_ratio']['p50']:.4f}, TPOT ratio p50 {ag['tpot_ratio']['p50']:.4f}, "
          f"TPOT diff p50 {ag['tpot_minus_engine_ms']['p50']:.2f} ms")


def _flags(view: dict) -> list[bool]:
    """Per measured request, in order: served more than 5 % from the prefix cache?"""
    lines = [ln for ln in read_jsonl(Path(view["path"]) / "requests.jsonl") if ln["kind"] == "measured"]
    return [ln["cached_tokens"] > 0.05 * ln["prompt_tokens"] for ln in lines]


def _cache_runs(cfg, model: str, warmup: int = 1) -> tuple[dict, dict]:
    # 1100 tokens: the ~24 tokens every chat prompt shares (template, run tag) stay under the 5 % flag,
    # and prompts are long enough (>= 1024) to count in prefill figures unless served from cache
    common = dict(workload="chat", shapes=(ClosedLoop(1),), input_tokens=1100, output_tokens=16, requests=3,
                  warmup=warmup)
    own = load(run_bench(cfg, model, BenchSpec(**common), gate_mode=False).folder)
    rep = load(run_bench(cfg, model, BenchSpec(**common, repeat_prompt=True), gate_mode=False).folder)
    return own, rep


@pytest.mark.llamacpp
def test_cached_fraction_on_llamacpp(campaign_config, llama):
    own, rep = _cache_runs(campaign_config, "smollm2")
    fo, fr = _point(own), _point(rep)
    # servedeck's prompts: only the chat template and the run tag are shared (~2 % of 1100 tokens)
    assert fo["cached_fraction"] < 0.05 and fo["cache"]["requests_over_threshold"] == 0
    assert fo["cache"]["counters"]["available"] and fo["cache"]["counters"]["fraction"] < 0.05
    # one prompt sent three times: the two after the first come from the cache
    assert fr["cached_fraction"] > 0.5 and fr["cache"]["counters"]["fraction"] > 0.5
    assert fr["cache"]["requests_over_threshold"] == 2
    assert _flags(rep) == [False, True, True]
    assert fr["prefill_tok_s"]["n"] == 1 and fr["prefill_tok_s"]["excluded_cached"] == 2
    assert any("prefix cache" in w for w in fr["warnings"])
    ag = fo["agreement"]
    print(f"\nllama.cpp cached fraction: own prompts {fo['cached_fraction']:.3f}, repeated {fr['cached_fraction']:.3f}; "
          f"agreement (chat 1100/16): TTFT-prompt_ms p50 {ag['ttft_minus_prompt_ms']['p50']:.1f} ms, "
          f"TPOT ratio p50 {ag['tpot_ratio']['p50']:.4f}, E2E-engine p50 {ag['e2e_minus_engine_ms']['p50']:.1f} ms")


@pytest.mark.vllm
@pytest.mark.slow
def test_cached_fraction_on_vllm(campaign_config, vllm):
    own, rep = _cache_runs(campaign_config, "smollm2-vllm", warmup=0)  # vLLM's CPU build prefills slowly
    fo, fr = _point(own), _point(rep)
    assert fo["cache"]["counters"]["available"] and fr["cache"]["counters"]["available"]
    assert fo["cached_fraction"] < 0.05
    assert fr["cached_fraction"] > 0.5
    # with --enable-prompt-tokens-details vLLM says it per request too, so the hits are flagged
    assert fr["cache"]["requests_over_threshold"] == 2 and _flags(rep) == [False, True, True]
    assert fr["prefill_tok_s"]["n"] == 1 and fr["prefill_tok_s"]["excluded_cached"] == 2
    print(f"\nvLLM cached fraction (counters): own prompts {fo['cache']['counters']['fraction']:.3f}, "
          f"repeated {fr['cache']['counters']['fraction']:.3f}")


@pytest.mark.llamacpp
def test_decode_workload_measures_decode_only(campaign_config, llama):
    """Issue 8 defect 11: the seed's decode-speed check, one fixed prompt on /v1/completions after a warm-up."""
    from servedeck.report import markdown

    spec = BenchSpec(workload="decode", shapes=(ClosedLoop(1),), input_tokens=64, output_tokens=24,
                     requests=3, warmup=1)
    out = run_bench(campaign_config, "smollm2", spec, gate_spec=GateSpec(context=768))
    summary = json.loads((out.folder / "summary.json").read_text())
    w = summary["workload"]
    assert w["workload"] == "decode" and w["api"] == "completions" and w["fixed_prompt"] is True
    lines = read_jsonl(out.folder / "requests.jsonl")
    assert [ln["kind"] for ln in lines] == ["warmup", "measured", "measured", "measured"]
    assert len({ln["prompt_tokens"] for ln in lines}) == 1  # the same prompt every time
    assert all(ln["output_tokens"] == 24 for ln in lines)
    fig = summary["points"][0]["figures"]["decode"]
    assert fig["requests"] == 3 and fig["tpot_ms"]["p50"] > 0
    assert abs(fig["decode_tok_s"]["p50"] * fig["tpot_ms"]["p50"] / 1000 - 1) < 0.2
    # llama.cpp's own account agrees that what was timed is decoding (its predicted_ms per token)
    assert 0.5 < summary["points"][0]["figures"]["agreement"]["tpot_ratio"]["p50"] < 2.0
    md = markdown(load(out.folder))
    assert "decode speed only: TPOT and decode tok/s; prefill (TTFT) is excluded" in md
    assert "decode tok/s p50/min" in md and "prefill tok/s p50" not in md
    assert "warm-up 1 per point with that same prompt" in md and "distinct from the measured" not in md


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_points_carry_the_engines_own_account_of_the_same_requests(campaign_config, vllm):
    """Issue 32: on the H200 servedeck and `vllm bench serve` disagreed at 64 streams; vLLM's own histograms
    on /metrics decide. Every vLLM point now carries them beside the client's figures, diffed over its
    measured phase: the same requests counted, the client's times no shorter than the engine's (the client's
    span holds the engine's), and TPOT, timed first to last token on both sides, close."""
    spec = BenchSpec(workload="chat", shapes=(ClosedLoop(2),), input_tokens=128, output_tokens=16, requests=6,
                     warmup=1)
    ea = _point(load(run_bench(campaign_config, "smollm2-vllm", spec, gate_mode=False).folder))["engine_agreement"]
    assert ea is not None and ea["same_requests"] is True, ea
    f = ea["figures"]
    assert {"ttft", "tpot", "e2e", "queue"} <= set(f), sorted(f)
    assert f["ttft"]["engine"]["requests"] == f["ttft"]["client"]["requests"] == 6
    assert f["ttft"]["mean_minus_engine_ms"] > 0 and f["e2e"]["mean_minus_engine_ms"] > 0
    assert 0.8 < f["tpot"]["mean_ratio"] < 1.25, f["tpot"]
    print(f"\nvLLM CPU, chat 128/16 at c=2: TTFT mean client {f['ttft']['client']['mean_ms']:.1f} / engine "
          f"{f['ttft']['engine']['mean_ms']:.1f} ms; TPOT {f['tpot']['client']['mean_ms']:.2f} / "
          f"{f['tpot']['engine']['mean_ms']:.2f} ms; E2E {f['e2e']['client']['mean_ms']:.1f} / "
          f"{f['e2e']['engine']['mean_ms']:.1f} ms; engine queue mean {f['queue']['engine']['mean_ms']:.2f} ms")
