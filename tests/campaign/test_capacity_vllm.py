"""The capacity search once on vLLM's CPU build (issue 22 asks for one test there; the others are on llama.cpp
in tests/capacity/). The same derivation as there: TTFT p50 measured at c=1 and c=4 on this server first, the
SLO's limit their geometric mean, so the boundary lies inside the range whatever this machine's speed; --max 4
bounds it (vLLM's own cap is its 256 sequences, far beyond what a CPU test should reach)."""

from __future__ import annotations

import json
import math

import pytest

from servedeck.workloads.points import BenchSpec
from servedeck.workloads.capacity import SEARCH_FILE, CapacitySpec
from servedeck.workloads.session import run as capacity
from servedeck.workloads.search import Resolution
from servedeck.workloads.session import Outcome, measured, run as bench
from servedeck.loadgen import ClosedLoop
from servedeck.loadgen.loop import run as run_loop
from servedeck.runs import load
from servedeck.slo import parse_slo

pytestmark = [pytest.mark.engine, pytest.mark.vllm]

MODEL = "smollm2-vllm"
# 32-token answers: the client self-check's lag allowance grows with a request's e2e (5 ms at least); with
# 4-token answers the search ended client-bound in the first two runs here
POINT = dict(workload="chat", input_tokens=128, output_tokens=32, requests=4, warmup=1)


@pytest.fixture(scope="module")
def vllm_search(campaign_config, campaign_home, vllm, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # module scope: the per-test home and results are not set yet
        mp.setenv("SERVEDECK_HOME", str(campaign_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp_path_factory.mktemp("capacity-vllm-results")))
        spec = BenchSpec(shapes=(ClosedLoop(1), ClosedLoop(4)), **POINT)
        out = Outcome()
        with measured(campaign_config, MODEL, False, out) as target:
            run_loop(bench(target, spec, gate_mode=False, outcome=out))
        one, four = (p["figures"]["ttft_ms"]["p50"] for p in load(out.folder)["points"])
        limit_ms = math.sqrt(one * four)
        cspec = CapacitySpec(find="max-concurrency", slo=parse_slo(f"ttft_p50<={limit_ms:.1f}ms,error_rate<=0%"),
                             bench=BenchSpec(shapes=(), **POINT), max_load=4, resolution=Resolution(absolute=1))
        out = Outcome()
        with measured(campaign_config, MODEL, False, out) as target:
            run_loop(capacity(target, cspec, gate_mode=False, outcome=out))
        return json.loads((out.folder / SEARCH_FILE).read_text()), load(out.folder)


def test_the_search_on_vllm_settles_with_every_step_a_point(vllm_search):
    doc, view = vllm_search
    reasons = [p["figures"]["client"]["reasons"] for p in view["points"]]
    if doc["verdict"] == "client-bound":
        # vLLM and the client share this 2-core box: when the self-check calls a step client-bound (seen
        # in two of three runs here), the search must stop at that step and say why, not count it as a result
        assert doc["steps"][-1]["judged"]["client_bound"] and reasons[-1], reasons
    else:
        assert doc["verdict"] in ("found", "capped", "unstable above", "fails at smallest load"), reasons
    assert [p["shape"]["concurrency"] for p in view["points"]] == [s["load"] for s in doc["steps"]]


def test_the_search_on_vllm_judges_every_threshold_and_re_measures_its_ends(vllm_search):
    doc, _ = vllm_search
    assert all([t["key"] for t in s["judged"]["thresholds"]] == ["ttft_p50", "error_rate"] for s in doc["steps"])
    if doc["verdict"] == "client-bound":
        return  # the search stopped before verifying: the first test checks that it says so
    loads = [s["load"] for s in doc["steps"]]
    lo, hi = doc["boundary"]["max_passing"], doc["boundary"]["min_failing"]
    assert lo is None or loads.count(lo) >= 2
    assert hi is None or loads.count(hi) >= 2


def test_the_search_on_vllm_names_its_binding_constraint(vllm_search):
    doc, _ = vllm_search
    assert doc["binding"] == ("ttft_p50" if doc["boundary"]["min_failing"] is not None else None)
