"""The exact-answer and lm-eval gates on vLLM's CPU build (SmolLM2-135M in HF layout), sharing the campaign tests'
session server: every question answered and scored, its verdict rebuilt from eval.jsonl."""

from __future__ import annotations

import asyncio
import json

import pytest

from questions import arithmetic, write
from servedeck.workloads.session import run_accuracy
from servedeck.workloads.session import Outcome, measured
from servedeck.gates.exact import ExactGate
from servedeck.runs import load

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.slow]


def test_exact_gate_on_vllm(campaign_config, vllm, tmp_path):
    f = write(tmp_path / "q.jsonl", arithmetic(23, 8))
    out = Outcome()
    with measured(campaign_config, "smollm2-vllm", False, out) as target:
        asyncio.run(run_accuracy(target, ExactGate(path=f, threshold=0.0, concurrency=4), outcome=out))
    lines = [json.loads(x) for x in (out.folder / "eval.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and not any(x.get("error") for x in lines)
    view = load(out.folder)
    acc = view["gate"]["accuracy"]["eval"]
    assert view["engine"] == "vllm" and acc["status"] == "passed"
    assert acc["result"]["correct"] == sum(x["correct"] for x in lines)


def test_lm_eval_gate_on_vllm_fails_above_its_score(campaign_config, vllm, tmp_path):
    from questions import lm_eval_task
    from servedeck.gates.lmeval import LmEvalGate

    d = lm_eval_task(tmp_path / "tasks", "arith", arithmetic(29, 8))
    out = Outcome()
    with measured(campaign_config, "smollm2-vllm", False, out) as target:
        asyncio.run(run_accuracy(target, LmEvalGate(task="arith", task_dir=d, threshold=1.0, concurrency=4),
                                 outcome=out))
    acc = load(out.folder)["gate"]["accuracy"]["eval"]
    assert acc["result"]["samples"] == 8
    assert acc["result"]["score"] == pytest.approx(acc["result"]["lm_eval"]["exact_match,last-number"])
    assert acc["result"]["score"] < 1.0 and acc["status"] == "failed"  # SmolLM2-135M is no calculator
    assert list((out.folder / "lm-eval").rglob("samples_arith_*.jsonl"))
