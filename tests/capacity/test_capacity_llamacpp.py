"""The capacity search on a real llama-server (SmolLM2, 4 slots, tiny loads).

The SLO is derived from what this server does here, before the search: TTFT p50 at c=1 and at c=4
(four 128-token prompts prefilled together take about four times as long on a CPU), and the limit set
between them (their geometric mean), so the boundary falls inside the search's range whatever the
machine's speed. The p50 (not p95) keeps four requests per point from judging on one outlier."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from servedeck.workloads.points import BenchSpec
from servedeck.workloads.capacity import SEARCH_FILE, CapacitySpec
from servedeck.workloads.session import run as capacity
from servedeck.workloads.session import Outcome, measured, run as bench
from servedeck.workloads.search import Resolution
from servedeck.fsio import read_jsonl
from servedeck.loadgen import ClosedLoop
from servedeck.loadgen.loop import run as run_loop
from servedeck.runs import load
from servedeck.slo import parse_slo

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

POINT = dict(workload="chat", input_tokens=128, output_tokens=4, requests=4, warmup=1)


def _ttft_p50(cfg, concurrency: list[int]) -> list[float]:
    spec = BenchSpec(shapes=tuple(ClosedLoop(c) for c in concurrency), **POINT)
    out = Outcome()
    with measured(cfg, "smollm2", False, out) as target:
        run_loop(bench(target, spec, gate_mode=False, outcome=out))
    return [p["figures"]["ttft_ms"]["p50"] for p in load(out.folder)["points"]]


def _search(cfg, slo_text: str, stop_below: float | None = None) -> tuple[dict, dict]:
    cspec = CapacitySpec(find="max-concurrency", slo=parse_slo(slo_text), bench=BenchSpec(shapes=(), **POINT),
                         resolution=Resolution(absolute=1), stop_below=stop_below)
    out = Outcome()
    with measured(cfg, "smollm2", False, out) as target:
        run_loop(capacity(target, cspec, gate_mode=False, outcome=out))
    return json.loads((out.folder / SEARCH_FILE).read_text()), load(out.folder)


@pytest.fixture(scope="module")
def mid_range_slo(capacity_config, capacity_home, llama, tmp_path_factory) -> str:
    with pytest.MonkeyPatch.context() as mp:  # module scope: the per-test home and results are not set yet
        mp.setenv("SERVEDECK_HOME", str(capacity_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp_path_factory.mktemp("capacity-results")))
        one, four = _ttft_p50(capacity_config, [1, 4])
        limit_ms = math.sqrt(one * four)
        return f"ttft_p50<={limit_ms:.1f}ms,error_rate<=0%"


@pytest.fixture(scope="module")
def mid_range_search(capacity_config, capacity_home, mid_range_slo, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(capacity_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp_path_factory.mktemp("capacity-results")))
        return _search(capacity_config, mid_range_slo)


def test_the_search_settles(mid_range_search):
    # which of the three depends on how busy this shared machine is while it runs (found when it stays
    # steady; capped or unstable above when it speeds up between steps): never the step budget
    doc, _ = mid_range_search
    assert doc["verdict"] in ("found", "capped", "unstable above")


def test_both_ends_of_the_boundary_are_re_measured(mid_range_search):
    doc, _ = mid_range_search
    lo, hi = doc["boundary"]["max_passing"], doc["boundary"]["min_failing"]
    loads = [s["load"] for s in doc["steps"]]
    assert loads.count(lo) >= 2
    assert hi is None or loads.count(hi) >= 2


def test_the_cap_is_the_engines_slots(mid_range_search):
    doc, _ = mid_range_search
    assert doc["cap"] == {"load": 4, "reason": "the engine's 4 slots"}


def test_every_step_is_an_ordinary_point_of_the_run(mid_range_search):
    doc, view = mid_range_search
    assert [p["index"] for p in view["points"]] == [s["judged"]["point"] for s in doc["steps"]]
    assert [p["shape"]["concurrency"] for p in view["points"]] == [s["load"] for s in doc["steps"]]
    assert all(p["figures"]["counts"]["measured"] == 4 for p in view["points"])
    lines = read_jsonl(Path(view["path"]) / "requests.jsonl")
    assert {ln["point"] for ln in lines} == set(range(len(doc["steps"])))


def test_a_re_measure_sends_fresh_prompts(mid_range_search):
    doc, view = mid_range_search
    lo = doc["boundary"]["max_passing"]
    nonces = [p["nonce"] for p in view["points"] if p["shape"]["concurrency"] == lo]
    assert len(set(nonces)) == len(nonces) >= 2


def test_the_binding_constraint_is_named_at_the_first_failing_load(mid_range_search):
    doc, _ = mid_range_search
    assert doc["binding"] == ("ttft_p50" if doc["boundary"]["min_failing"] is not None else None)


def test_each_step_says_why_and_judges_every_threshold(mid_range_search):
    doc, _ = mid_range_search
    assert all(s["why"] for s in doc["steps"])
    assert all([t["key"] for t in s["judged"]["thresholds"]] == ["ttft_p50", "error_rate"] for s in doc["steps"])


def test_the_run_summary_carries_the_capacity(mid_range_search):
    doc, view = mid_range_search
    assert view["capacity"]["capacity"] == doc["capacity"]


def test_a_search_held_to_a_floor_it_cannot_carry_stops_at_its_first_failing_load(capacity_config, mid_range_slo):
    """stop_below = 1000 good req/s, far past what this server carries: at the first load that fails, the requests it
    completed a second bound every load below it, so the search ends there, `below floor`, measured once, never
    bisected. A search whose every load passes up to the engine's slots (a box that sped up), or whose smallest load
    fails (one that slowed down), has no passing and failing pair to bound, and the floor is not judged."""
    doc, view = _search(capacity_config, mid_range_slo, stop_below=1000.0)
    assert doc["stop_below"] == 1000.0 and doc["floor"] == 1000.0  # a CPU launch: per launch
    hi = doc["boundary"]["min_failing"]
    print(f"\nsteps {[(s['load'], s['passed']) for s in doc['steps']]}: {doc['verdict']}")
    if hi is None or doc["boundary"]["max_passing"] is None:
        assert doc["verdict"] in ("capped", "fails at smallest load") and doc["below_floor"] is None
        return
    last = doc["steps"][-1]
    assert doc["verdict"] == "below floor" and (last["load"], last["passed"]) == (hi, False)
    assert [s["load"] for s in doc["steps"]].count(hi) == 1  # not measured again, nothing bisected below it
    j = last["judged"]
    completed = (j["measured"] - j["failed_requests"]) / j["window_s"]
    passing = [s["judged"]["goodput_request_s"] for s in doc["steps"] if s["passed"]]
    assert doc["below_floor"]["ceiling"] == pytest.approx(max([completed, *passing]))
    assert doc["below_floor"]["ceiling"] < 1000.0
    cap = view["capacity"]
    assert cap["verdict"] == "below floor" and cap["below_floor"]["at"] == hi and cap["capacity"] == doc["capacity"]


def test_an_slo_no_load_meets_fails_at_the_smallest_load(capacity_config, llama):
    one, = _ttft_p50(capacity_config, [1])
    doc, _ = _search(capacity_config, f"ttft_p50<={one / 20:.2f}ms")
    assert doc["verdict"] == "fails at smallest load"
    assert [s["load"] for s in doc["steps"]] == [1, 1]
    assert doc["binding"] == "ttft_p50"


def test_an_overloaded_open_loop_point_ends_early_as_failed(capacity_config, llama):
    """A rate ten times what the server finished at c=4 (measured here first) cannot be kept up with: the
    point ends early, failed, naming the overload, long before its requests could all have been served."""
    small = dict(workload="chat", input_tokens=64, output_tokens=2, warmup=1)
    spec = BenchSpec(shapes=(ClosedLoop(4),), requests=8, **small)
    out = Outcome()
    with measured(capacity_config, "smollm2", False, out) as target:
        run_loop(bench(target, spec, gate_mode=False, outcome=out))
    served = load(out.folder)["points"][0]["figures"]["request_s"]
    rate = 10 * served
    requests = int(rate * 20)  # 20 s of arrivals; served at the measured pace they would take 200 s
    cspec = CapacitySpec(find="max-rate", slo=parse_slo("e2e_p50<=60s"), arrivals="constant", start=rate,
                         bench=BenchSpec(shapes=(), requests=requests, **small))
    out = Outcome()
    with measured(capacity_config, "smollm2", False, out) as target:
        run_loop(capacity(target, cspec, gate_mode=False, outcome=out))
    view = load(out.folder)
    first = view["points"][0]
    assert first["status"] == "failed"
    assert first["reason"].startswith("overloaded: arrivals outpace completions")
    assert first["figures"]["counts"]["ok"] < requests / 2
    doc = json.loads((out.folder / SEARCH_FILE).read_text())
    assert doc["steps"][0]["judged"]["overloaded"] == first["reason"]


def test_the_run_section_says_a_cpu_run_has_no_gpu_energy(mid_range_search):
    """No GPU and no replayed readings: the capacity's energy is said to be absent, not shown as a number."""
    from servedeck.report.capacity import run_section

    _, view = mid_range_search
    assert "Energy there: no GPU." in "\n".join(run_section(view))
