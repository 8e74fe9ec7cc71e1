"""Both accuracy gates on vLLM's CPU build (SmolLM2-135M, HF layout) pass and fail at thresholds set around
the score they measure, as tests/gates/test_exact_llamacpp.py and test_lmeval.py do on llama.cpp.

Each gate runs once at threshold 0 (a module fixture on the campaign tests' session server); the thresholds
are then derived from that score (questions.thresholds_around: 0.1 either side, and a score too near 0 or 1
to bracket fails the test) and the CLI gates the same questions again at each.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from questions import arithmetic, lm_eval_task, thresholds_around, write
from servedeck.workloads.session import run_accuracy
from servedeck.workloads.session import Outcome, measured
from servedeck.gates.exact import ExactGate
from servedeck.gates.lmeval import LmEvalGate
from servedeck.runs import load

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.slow]

N = 20
MODEL = "smollm2-vllm"


def _cli(cfg_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg_path), "gate", MODEL, *args,
                           "--concurrency", "4"], capture_output=True, text=True, timeout=600, env=dict(os.environ))


def _measure(cfg, home, tmp, gate) -> float:
    with pytest.MonkeyPatch.context() as mp:  # before the per-test fixtures: say where, as they would
        mp.setenv("SERVEDECK_HOME", str(home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp / "results"))
        out = Outcome()
        with measured(cfg, MODEL, False, out) as target:
            asyncio.run(run_accuracy(target, gate, outcome=out))
    acc = load(out.folder)["gate"]["accuracy"]["eval"]
    assert acc["result"]["samples"] == N and acc["result"]["errors"] == 0, acc["result"]
    print(f"\nMEASURED {gate.kind} on vLLM: score {acc['result']['score']:.3f} "
          f"({acc['result']['correct']}/{N}), gate wall time {acc.get('wall_s')} s")
    return acc["result"]["score"]


@pytest.fixture(scope="module")
def exact_measured(campaign_config, vllm, campaign_home, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact")
    f = write(tmp / "arith.jsonl", arithmetic(23, N))
    return f, _measure(campaign_config, campaign_home, tmp, ExactGate(path=f, threshold=0.0, concurrency=4))


@pytest.fixture(scope="module")
def lm_measured(campaign_config, vllm, campaign_home, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    d = lm_eval_task(tmp / "tasks", "arith", arithmetic(29, N))
    return d, _measure(campaign_config, campaign_home, tmp,
                       LmEvalGate(task="arith", task_dir=d, threshold=0.0, concurrency=4))


def test_exact_gate_on_vllm_passes_just_below_its_measured_score(campaign_config, exact_measured):
    f, score = exact_measured
    below, _ = thresholds_around(score, "the exact gate on vLLM")
    r = _cli(campaign_config.path, "--eval", str(f), "--threshold", str(below))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gate passed" in r.stdout


def test_exact_gate_on_vllm_fails_just_above_its_measured_score(campaign_config, exact_measured):
    f, score = exact_measured
    _, above = thresholds_around(score, "the exact gate on vLLM")
    r = _cli(campaign_config.path, "--eval", str(f), "--threshold", str(above))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gate failed" in r.stdout


def test_lm_eval_gate_on_vllm_passes_just_below_its_measured_score(campaign_config, lm_measured):
    d, score = lm_measured
    below, _ = thresholds_around(score, "the lm-eval gate on vLLM")
    r = _cli(campaign_config.path, "--eval", "lm-eval:arith", "--task-dir", str(d), "--threshold", str(below))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gate passed" in r.stdout


def test_lm_eval_gate_on_vllm_fails_just_above_its_measured_score(campaign_config, lm_measured):
    d, score = lm_measured
    _, above = thresholds_around(score, "the lm-eval gate on vLLM")
    r = _cli(campaign_config.path, "--eval", "lm-eval:arith", "--task-dir", str(d), "--threshold", str(above))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gate failed" in r.stdout
