"""The capacity tables read back from a recorded campaign with repeats and a failed gate (no engine).

Input: tests/data/capacity-campaign-cpu-2026-12-01/ (its README says how it was made): real llama.cpp
(SmolLM2), variants parallel=1, parallel=4 and rope (8 slots, `rope-freq-base = 10`: fails the needle),
two launches each, one capacity search per launch under an SLO every load meets, so each search stops at
its slots (a cap the engine set: a figure, not a bound). Before the expected values are used, the first
tests check them against the run folders' own files (search.json, niah.log, summary.json): each repeat found
the same capacity, and the variant that carries the most (rope, 8) failed its gate. The recommendation ranks
by good requests/s at capacity: parallel=4's two launches carried 0.2959 and 0.1156, parallel=1's 0.1105 and
0.1042, so +92 % with a Welch interval that includes no difference.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.campaign.summary import render_markdown, status_view
from servedeck.fsio import read_jsonl
from servedeck.loadgen import RequestRecord
from servedeck.report.build import write
from servedeck.report.collect import from_campaign
from servedeck.runs import load
from servedeck.telemetry.figures import of_point

RECORDED = Path(__file__).resolve().parents[1] / "data" / "capacity-campaign-cpu-2026-12-01" / "results"
CAMPAIGN = "cap__1201-152436"
SERVEDECK = [sys.executable, "-m", "servedeck"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A copy of the recorded results tree: reports are written beside it, never into tests/data."""
    dst = tmp_path_factory.mktemp("capacity-recorded") / "results"
    shutil.copytree(RECORDED, dst)
    return dst


@pytest.fixture(scope="module")
def doc(results) -> dict:
    return json.loads((results / "campaigns" / CAMPAIGN / "campaign.json").read_text())


def _bench_runs(results: Path, doc: dict, variant: str) -> list[Path]:
    return [results / "runs" / run for c in doc["cells"] if c["variant"] == variant for run in c["runs"]
            if (results / "runs" / run / "search.json").exists()]


def _md_rows(md: str, start: str) -> list[list[str]]:
    part = md[md.index(start):]
    part = part[:part.index("\n\n", part.index("|"))]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in part.splitlines() if ln.startswith("| ")]


@pytest.mark.parametrize("variant,capacities", [("parallel=1", [1, 1]), ("parallel=4", [4, 4]), ("rope", [8, 8])])
def test_the_recorded_searches_each_found_the_slots(results, doc, variant, capacities):
    got = [json.loads((r / "search.json").read_text())["capacity"] for r in _bench_runs(results, doc, variant)]
    assert got == capacities


@pytest.mark.parametrize("variant,found", [("parallel=1", True), ("parallel=4", True), ("rope", False)])
def test_the_recorded_gates_found_the_needle_or_not(results, doc, variant, found):
    probes = [ln for r in _bench_runs(results, doc, variant) for ln in read_jsonl(r / "niah.log") if "ok" in ln]
    assert [p["ok"] for p in probes] == [found, found]


def test_the_recorded_goodputs_at_capacity(results, doc):
    got = {v: [round(json.loads((r / "summary.json").read_text())["capacity"]["goodput_request_s"], 4)
               for r in _bench_runs(results, doc, v)] for v in ("parallel=1", "parallel=4")}
    assert got == {"parallel=1": [0.1105, 0.1042], "parallel=4": [0.2959, 0.1156]}


def test_status_json_carries_every_launchs_gate(results, doc):
    rows = status_view(doc, results / "runs", results / "campaigns" / CAMPAIGN)["capacity"]
    assert {r["variant"]: r["gates"] for r in rows} == {"parallel=1": ["passed", "passed"],
                                                        "parallel=4": ["passed", "passed"],
                                                        "rope": ["failed", "failed"]}


def test_campaign_md_marks_the_failed_gates_capacity_as_not_a_result(results, doc):
    rows = _md_rows(render_markdown(doc, results / "runs"), "## Capacity under each SLO")
    gate = rows[0].index("gate")
    assert {r[1]: r[gate] for r in rows[1:]} == {"parallel=1": "passed", "parallel=4": "passed",
                                                  "rope": "failed: not a result"}


def test_campaign_md_recommendation_carries_the_repeats_interval(results, doc):
    rows = _md_rows(render_markdown(doc, results / "runs"), "### Recommendation")
    assert rows[1][2] == ("0.21 [-0.9396, 1.351] good req/s per launch (CPU) (6.6 output tok/s) at c=4, +92% "
                          "[-970%, +1153%] (95 %, repeats, Welch t) over parallel=1 (0.11); the interval includes "
                          "no difference: not distinguishable from noise")


def test_campaign_md_does_not_recommend_the_variant_that_carries_the_most_but_failed_its_gate(results, doc):
    rows = _md_rows(render_markdown(doc, results / "runs"), "### Recommendation")
    assert rows[1][1] == "**parallel=4**"


def test_campaign_md_says_why_the_failed_gate_was_left_out(results, doc):
    rows = _md_rows(render_markdown(doc, results / "runs"), "### Recommendation")
    assert rows[1][3] == "rope (0.17 req/s per launch (CPU) at c=8; gate failed: not a result)"


def _rebuilt(run: Path) -> dict:
    """The GPU figures at the run's capacity point, rebuilt from its telemetry.jsonl and requests.jsonl."""
    view = load(run)
    index = view["capacity"]["point"]
    point = next(p for p in view["points"] if p["index"] == index)
    records = [RequestRecord.from_json({k: v for k, v in ln.items() if k != "point"})
               for ln in read_jsonl(run / "requests.jsonl") if ln.get("point") == index]
    return of_point(run, point, records)["gpu"]


def test_campaign_md_energy_at_capacity_is_the_mean_of_the_repeats(results, doc):
    rows = _md_rows(render_markdown(doc, results / "runs"), "## Capacity under each SLO")
    j, w = rows[0].index("J / output token at capacity"), rows[0].index("mean W at capacity")
    want = {}
    for v in ("parallel=1", "parallel=4", "rope"):
        gpus = [_rebuilt(r) for r in _bench_runs(results, doc, v)]
        want[v] = (f"{sum(g['j_per_output_token'] for g in gpus) / len(gpus):.4g}",
                   f"{sum(g['mean_power_w'] for g in gpus) / len(gpus):.0f}")
    assert {r[1]: (r[j], r[w]) for r in rows[1:]} == want


def test_the_report_recommends_parallel4_with_the_interval_and_names_rope_left_out(results):
    md, _ = write(from_campaign(results / "campaigns" / CAMPAIGN), results / "campaigns" / CAMPAIGN)
    text = md.read_text()
    part = text[text.index("## Capacity under each SLO"):]
    row = next(ln for ln in part.splitlines() if ln.startswith("| interactive") and "| parallel=4 |" in ln
               and "over parallel=1" in ln)
    assert row.endswith("| parallel=4 | 0.21 [-0.9396, 1.351] good req/s per launch (CPU) (6.6 output tok/s) at "
                        "c=4, +92% [-970%, +1153%] (95 %, repeats, Welch t) over parallel=1 (0.11); the interval "
                        "includes no difference: not distinguishable from noise | rope (0.17 req/s per launch (CPU) "
                        "at c=8; gate failed: not a result) |")


def test_compare_says_the_failed_gates_capacity_is_not_a_result(results, tmp_path):
    env = {**os.environ, "SERVEDECK_HOME": str(tmp_path / "home"), "SERVEDECK_RESULTS": str(results)}
    env.pop("SERVEDECK_CONFIG", None)
    r = subprocess.run(SERVEDECK + ["compare", "parallel=4", "rope", "--campaign", str(results / "campaigns" / CAMPAIGN)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("capacity ("))
    assert line.endswith("; B's gate failed: not a result"), line
