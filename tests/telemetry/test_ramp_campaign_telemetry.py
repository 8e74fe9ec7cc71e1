"""telemetry.jsonl in the other run folders that measure load: a ramp's (one conversation, sampled as
one stretch) and a campaign cell's (its bench points go through the same point code), on real llama.cpp."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ports import free_port
from servedeck.testing.ports import bindable
from telemetrykit import run_ramp
from tests.conftest import stop_everything
from servedeck.init import render_starter
from servedeck.workloads.ramp import RampSpec
from servedeck.fsio import read_jsonl

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def test_ramp_run_folder_holds_telemetry_of_its_conversation(campaign_config, llama, monkeypatch):
    monkeypatch.setenv("SERVEDECK_TELEMETRY_ENGINE_S", "0.2")
    spec = RampSpec(turn_tokens=160, answer_tokens=8, max_context=700, needle_every=0, time_cap_s=60.0)
    out = run_ramp(campaign_config, "smollm2", spec, gate_mode=False)
    lines = read_jsonl(out.folder / "telemetry.jsonl")
    assert {ln["point"] for ln in lines} == {"ramp"}
    samples = [ln for ln in lines if ln["source"] == "engine" and ln["kind"] == "sample"]
    assert len(samples) >= 2
    summary = json.loads((out.folder / "summary.json").read_text())
    assert summary["telemetry"]["point"] == "ramp"
    tele = summary["telemetry"]["figures"]
    assert tele["sampled"] is True and tele["engine"]["samples"] == len(samples)
    assert summary["ramp"]["ok_turns"] >= 1  # the ramp's own account is still there beside it


CAMPAIGN = """
[campaign]
name = "t-telemetry"
model = "smollm2"
cell_timeout = "3m"
gate = false

[[variants]]
name = "p2"
args = { parallel = 2, threads = 1 }

[[workloads]]
kind = "chat"
concurrency = [2]
input_tokens = 48
output_tokens = 12
requests = 4
warmup = 0
"""


def _models_toml(tmp_path):
    """The starter models.toml, SmolLM2 at context 2048 on a port whose next few are free too (a campaign's
    variant takes the port after its base model's)."""
    for _ in range(100):
        port = free_port()
        if all(bindable(p) for p in range(port, port + 4)):
            break
    text = render_starter().replace("port = 8081", f"port = {port}").replace("context = 8192", "context = 2048", 1)
    for old in ("8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_campaign_cell_run_folder_holds_telemetry(tmp_path, engines_ready):
    camp = tmp_path / "camp.toml"
    camp.write_text(CAMPAIGN)
    results, home = tmp_path / "results", tmp_path / "cell-home"
    home.mkdir()
    env = {**os.environ, "SERVEDECK_RESULTS": str(results), "SERVEDECK_HOME": str(home),
           "SERVEDECK_TELEMETRY_ENGINE_S": "0.2"}
    try:
        res = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(_models_toml(tmp_path)), "campaign",
                              "run", str(camp), "--json"], env=env, capture_output=True, text=True, timeout=300)
    finally:
        stop_everything(home)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted((results / "runs").iterdir())
    assert len(runs) == 1
    lines = read_jsonl(runs[0] / "telemetry.jsonl")
    assert any(ln["source"] == "engine" and ln["kind"] == "sample" and ln["point"] == 0 for ln in lines)
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["points"][0]["figures"]["telemetry"]["engine"]["max_running"] >= 1
