"""The exact-answer gate on vLLM's CPU build (SmolLM2-135M in HF layout), sharing the campaign tests'
session server: every question answered and scored, its verdict rebuilt from eval.jsonl."""

from __future__ import annotations

import asyncio
import json

import pytest

from questions import arithmetic, write
from servedeck.campaign.accuracy import run_accuracy
from servedeck.campaign.session import Outcome, measured
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
