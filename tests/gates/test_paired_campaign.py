"""A campaign on real llama.cpp with an accuracy gate: the reference variant, the same configuration
launched again, and a variant whose RoPE is squeezed (rope-freq-scale 0.5: positions read at half
their distance), which really answers worse (0.25 → 0.025 of these 40 questions when first measured).
The paired table names the difference for the squeezed variant and none for the relaunch; at a
threshold of 0.1 the squeezed launch fails its gate and its figures are not results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from questions import arithmetic, write
from servedeck.init import render_starter
from tests.conftest import SESSION, TEST_MARK, stop_everything
from tests.campaign_matrix.test_matrix_llamacpp import free_block

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp, pytest.mark.slow]

CAMPAIGN = """
[campaign]
name = "acc"
model = "smollm2"
cell_timeout = "8m"
gate = { niah = false, eval = { path = "arith.jsonl", threshold = 0.1, concurrency = 4 } }

[[variants]]
name = "ref"

[[variants]]
name = "again"

[[variants]]
name = "squeezed"
args = { rope-freq-scale = 0.5 }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 64
output_tokens = 4
requests = 2
warmup = 0
"""


def _cli(cfg: Path, env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, engines_ready):
    tmp = tmp_path_factory.mktemp("acc")
    home, results = tmp / "home", tmp / "results"
    home.mkdir()
    text = render_starter().replace("port = 8081", f"port = {free_block()}")
    cfg = tmp / "models.toml"
    cfg.write_text(text)
    write(tmp / "arith.jsonl", arithmetic(23, 40))
    (tmp / "camp.toml").write_text(CAMPAIGN)
    env = {**os.environ, "SERVEDECK_HOME": str(home), "SERVEDECK_RESULTS": str(results), TEST_MARK: SESSION,
           "COLUMNS": "250"}
    try:
        res = _cli(cfg, env, "campaign", "run", str(tmp / "camp.toml"), "--json")
        folder = sorted((results / "campaigns").glob("*/campaign.json"))[-1].parent
        yield {"res": res, "cfg": cfg, "env": env, "folder": folder, "results": results}
    finally:
        stop_everything(home)


def test_every_cell_ran_its_accuracy_gate(campaign):
    assert campaign["res"].returncode == 0, campaign["res"].stdout[-2000:] + campaign["res"].stderr[-3000:]
    runs = sorted((campaign["results"] / "runs").iterdir())
    gate_runs = [r for r in runs if (r / "eval.jsonl").exists()]
    assert len(gate_runs) == 3
    for r in gate_runs:
        assert len((r / "eval.jsonl").read_text().splitlines()) == 40


def test_bench_runs_cite_their_launchs_accuracy_gate(campaign):
    for r in sorted((campaign["results"] / "runs").iterdir()):
        s = json.loads((r / "summary.json").read_text())
        if s["kind"] == "bench":
            cited = s["gates"]["eval"]["source"]
            assert (r.parent / cited / "eval.jsonl").exists()
            assert json.loads((r.parent / cited / "summary.json").read_text())["layout"] == s["layout"]


def _compare(campaign, b: str) -> dict:
    r = _cli(campaign["cfg"], campaign["env"], "compare", "ref", b, "--campaign", str(campaign["folder"]), "--json",
             timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["accuracy"][0]


def test_the_squeezed_variant_is_named_as_losing_accuracy(campaign):
    x = _compare(campaign, "squeezed")
    assert x["pairs"] == 40
    assert x["distinguishable"] is True
    assert x["text"].startswith("B lost "), x["text"]
    assert x["high"] < 0  # the whole interval below zero


def test_the_relaunch_of_the_same_configuration_shows_no_difference(campaign):
    x = _compare(campaign, "again")
    assert x["pairs"] == 40
    assert x["text"].startswith("no difference distinguishable"), x["text"]


def test_compare_text_carries_the_paired_verdict(campaign):
    r = _cli(campaign["cfg"], campaign["env"], "compare", "ref", "squeezed", "--campaign", str(campaign["folder"]),
             timeout=120)
    assert "accuracy (gate eval): A " in r.stdout and "(paired, 40 samples, p = " in r.stdout, r.stdout


def test_the_report_has_the_paired_table_for_every_other_variant(campaign):
    r = _cli(campaign["cfg"], campaign["env"], "report", str(campaign["folder"]), "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    md = Path(json.loads(r.stdout)["report_md"]).read_text()
    section = md.split("\n## Accuracy against the reference (paired)", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ref |")]
    assert len(rows) == 2, section
    assert any("| squeezed |" in ln and "B lost" in ln for ln in rows), section
    assert any("| again |" in ln and "no difference distinguishable" in ln for ln in rows), section


def test_a_failed_accuracy_gate_marks_its_launchs_figures_as_not_results(campaign):
    from servedeck.runs import load

    labels = {}
    for r in sorted((campaign["results"] / "runs").iterdir()):
        view = load(r)
        if view["kind"] == "bench":
            labels[view["layout"]] = (view["gate"]["status"], view["label"])
    assert labels["squeezed"] == ("failed", "ok; gate failed: not a result")
    assert labels["ref"] == ("passed", "ok; result")
