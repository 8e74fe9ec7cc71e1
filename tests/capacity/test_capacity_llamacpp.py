"""The capacity search on a real llama-server (SmolLM2, 4 slots, tiny loads).

The SLO is derived from what this server does here, before the search: TTFT p50 at c=1 and at c=4
(four 256-token prompts prefilled together take about four times as long on a CPU), and the limit set
between them (their geometric mean), so the boundary falls inside the search's range whatever the
machine's speed. The p50 (not p95) keeps four requests per point from judging on one outlier."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from servedeck.campaign.bench import BenchSpec
from servedeck.campaign.capacity import SEARCH_FILE, CapacitySpec, capacity
from servedeck.campaign.session import Outcome, bench, measured
from servedeck.campaign.search import Resolution
from servedeck.fsio import read_jsonl
from servedeck.loadgen import ClosedLoop
from servedeck.loadgen.loop import run as run_loop
from servedeck.runs import load
from servedeck.slo import parse_slo

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

POINT = dict(workload="chat", input_tokens=256, output_tokens=4, requests=4, warmup=1)


def _ttft_p50(cfg, concurrency: list[int]) -> list[float]:
    spec = BenchSpec(shapes=tuple(ClosedLoop(c) for c in concurrency), **POINT)
    out = Outcome()
    with measured(cfg, "smollm2", False, out) as target:
        run_loop(bench(target, spec, gate_mode=False, outcome=out))
    return [p["figures"]["ttft_ms"]["p50"] for p in load(out.folder)["points"]]


def _search(cfg, slo_text: str) -> tuple[dict, dict]:
    cspec = CapacitySpec(find="max-concurrency", slo=parse_slo(slo_text), bench=BenchSpec(shapes=(), **POINT),
                         resolution=Resolution(absolute=1))
    out = Outcome()
    with measured(cfg, "smollm2", False, out) as target:
        run_loop(capacity(target, cspec, gate_mode=False, outcome=out))
    return json.loads((out.folder / SEARCH_FILE).read_text()), load(out.folder)


@pytest.fixture(scope="module")
def mid_range_search(capacity_config, capacity_home, llama, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # module scope: the per-test home and results are not set yet
        mp.setenv("SERVEDECK_HOME", str(capacity_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp_path_factory.mktemp("capacity-results")))
        one, four = _ttft_p50(capacity_config, [1, 4])
        limit_ms = math.sqrt(one * four)
        return _search(capacity_config, f"ttft_p50<={limit_ms:.1f}ms,error_rate<=0%")


def test_the_boundary_lies_inside_the_range_and_is_re_measured(mid_range_search):
    doc, _ = mid_range_search
    assert doc["verdict"] == "found"
    lo, hi = doc["boundary"]["max_passing"], doc["boundary"]["min_failing"]
    loads = [s["load"] for s in doc["steps"]]
    assert loads.count(lo) >= 2 and loads.count(hi) >= 2


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


def test_the_binding_constraint_is_named(mid_range_search):
    doc, _ = mid_range_search
    assert doc["binding"] == "ttft_p50"


def test_each_step_says_why_and_judges_every_threshold(mid_range_search):
    doc, _ = mid_range_search
    assert all(s["why"] for s in doc["steps"])
    assert all([t["key"] for t in s["judged"]["thresholds"]] == ["ttft_p50", "error_rate"] for s in doc["steps"])


def test_the_run_summary_carries_the_capacity(mid_range_search):
    doc, view = mid_range_search
    assert view["capacity"]["capacity"] == doc["capacity"]


def test_an_slo_no_load_meets_fails_at_the_smallest_load(capacity_config, llama):
    one, = _ttft_p50(capacity_config, [1])
    doc, _ = _search(capacity_config, f"ttft_p50<={one / 20:.2f}ms")
    assert doc["verdict"] == "fails at smallest load"
    assert [s["load"] for s in doc["steps"]] == [1, 1]
