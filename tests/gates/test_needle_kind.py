"""The needle as one gate kind (gates/kinds.py) on real llama.cpp: run by the one runner every kind goes
through, its niah.log lines carry the sample fields every kind writes, after the seed's own."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from servedeck.workloads.session import Outcome, gate_run, measured
from servedeck.gates.niah import GateSpec, NeedleGate, read_log
from servedeck.runs import load

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

SEED_KEYS = ["key", "depth", "prompt_tokens", "ok", "latency_s", "answer", "cached_tokens"]
SAMPLE_KEYS = ["id", "prompt_digest", "expected", "correct"]


@pytest.fixture
def needle_run(campaign_config, llama):
    out = Outcome()
    with measured(campaign_config, "smollm2", False, out) as target:
        asyncio.run(gate_run(target, NeedleGate(GateSpec(context=512, depths=(0.2, 0.8), seed=5)), out))
    return out.folder


def test_each_probe_line_is_a_sample_line_after_the_seeds_fields(needle_run):
    probes, printed = read_log((needle_run / "niah.log").read_text())
    assert printed is not None and len(probes) == 2
    for p in probes:
        assert list(p)[:7] == SEED_KEYS
        assert [k for k in p if k in SAMPLE_KEYS] == SAMPLE_KEYS
        assert p["id"] == f"{p['key']}/{p['depth']}"
        assert p["expected"] == p["code"] and p["correct"] == p["ok"]
        assert re.fullmatch(r"[0-9a-f]{16}", p["prompt_digest"])
    assert probes[0]["prompt_digest"] != probes[1]["prompt_digest"]  # each probe its own haystack


def test_the_needles_entry_keeps_its_place_in_summary_json(needle_run):
    summary = json.loads((needle_run / "summary.json").read_text())
    entry = summary["gate"]
    assert entry["kind"] == "niah" and entry["file"] == "niah.log" and entry["source"] == "this run"
    assert entry["spec"]["context"] == 512 and isinstance(entry["wall_s"], float)
    assert "niah" not in (summary.get("gates") or {})
    view = load(needle_run)
    assert view["gate"]["status"] == entry["status"] and view["gate"]["result"]["probes"] == 2
