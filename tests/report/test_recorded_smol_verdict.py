"""The first campaign on a GPU with real weights, rebuilt (no engine): `scripts/gpu-vllm.sh smol` at e246aa0 on
one H100 (SmolLM2-135M bf16 on vLLM 0.26.0, plain against n-gram speculation, SLO interactive
`ttft_p90<=250ms,tpot_p90<=15ms`). Its campaign.md recommended ngram, "+100% over plain (c=16)"
(docs/gpu-runs/h100-vllm-2026-12-06/smol-campaign.md), comparing two lower bounds as concurrencies.

What its own files say (read here from summary.json and campaign.json, not from the report code): plain's
search ended client-bound at c=16 carrying 52.57 good requests/s, ngram's capped at c=32 carrying 30.15, and
ngram's greedy outputs differ from plain's (the reference) in 6 of 8 prompts, with no `outputs_may_differ`.
So ngram may not be recommended, and plain is.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from servedeck.campaign.summary import render_markdown
from servedeck.page.stale import Basis
from servedeck.page.tried import campaign_entry
from servedeck.report.build import write
from servedeck.report.collect import from_campaign

BUNDLE = Path(__file__).resolve().parents[2] / "docs/gpu-runs/h100-vllm-2026-12-06/smol.tar.gz"


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("smol")
    with tarfile.open(BUNDLE) as tar:
        tar.extractall(root, filter="data")
    (folder,) = (root / "results" / "campaigns").iterdir()
    return folder


def _recommendation_row(md: str) -> list[str]:
    lines = md.splitlines()
    at = next(i for i, line in enumerate(lines) if "run this variant" in line)
    return [c.strip() for c in lines[at + 2].strip().strip("|").split(" | ")]


def test_the_recorded_figures_are_what_the_rules_are_applied_to(campaign):
    doc = json.loads((campaign / "campaign.json").read_text())
    caps = {}
    for cell in doc["cells"]:
        for run in cell["runs"]:
            cap = json.loads((campaign.parent.parent / "runs" / run / "summary.json").read_text()).get("capacity")
            if cap:
                caps[cell["variant"]] = (cap["verdict"], cap["capacity"], round(cap["goodput_request_s"], 2))
    assert caps == {"plain": ("client-bound", 16.0, 52.57), "ngram": ("capped", 32.0, 30.15)}
    check = doc["outputs_vs_reference"]["cells"]["ngram#1"]
    assert (doc["reference"], check["verdict"], check["identical"], check["prompts"]) == ("plain", "differs", 2, 8)
    assert "outputs_may_differ" not in doc["variants"]["ngram"]


def test_the_report_rebuilt_from_it_recommends_plain_and_says_why_not_ngram(campaign, tmp_path):
    md, _ = write(from_campaign(campaign), tmp_path / "report")
    row = _recommendation_row(md.read_text())
    assert row[1] == "plain"
    assert row[2].startswith("≥ 52.57 good req/s per GPU (≥ 6,729 output tok/s) at ≥ c=16")
    assert row[3].startswith("ngram (≥ 30.15 req/s per GPU at ≥ c=32; greedy outputs differ from plain's "
                             "(2/8 prompts identical)")


def test_campaign_md_rebuilt_from_it_recommends_plain(campaign):
    doc = json.loads((campaign / "campaign.json").read_text())
    text = render_markdown(doc, campaign.parent.parent / "runs")
    row = _recommendation_row(text)
    assert row[1] == "**plain**"
    assert "differ from plain (2/8 identical): not recommended" in text


def test_the_model_pages_tried_and_refuted_refutes_ngram_for_its_outputs_and_says_capacity_is_undecided(campaign):
    entry = campaign_entry(campaign, Basis())
    (ngram,) = entry["variants"]
    assert (ngram["variant"], ngram["verdict"], ngram["refuted"]) == ("ngram", "outputs differ", True)
    assert ngram["reasons"][0] == ("greedy outputs differ from plain's (2/8 prompts identical); "
                                   "`outputs_may_differ = true` on its [[variants]] entry allows it")
    capacity = [r for r in ngram["reasons"] if r.startswith("capacity")]
    assert capacity == ["capacity (max-concurrency under interactive (ttft_p90<=250ms,tpot_p90<=15ms)): A ≥ 52.57 "
                        "at ≥ c=16, B ≥ 30.15 at ≥ c=32 (good req/s per GPU at the load it took): undecided: B "
                        "(≥ 30.15) could still carry more than A (≥ 52.57); a higher `max` for B would decide"]
