"""The exact-answer gate on real llama.cpp (SmolLM2-135M), with questions this test makes from a seed.

The score is measured first (a gate at threshold 0 always passes); the CLI then gates the same
questions just below and just above it. Greedy answers on one server barely move between runs, and
the margin (0.1 = 2.4 questions of 24) absorbs what batching might change.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from questions import arithmetic, thresholds_around, write
from servedeck.workloads.session import run_accuracy
from servedeck.workloads.session import Outcome, measured
from servedeck.gates.exact import ExactGate
from servedeck.runs import load

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

N = 24
SEED = 23
SAMPLE_KEYS = ["id", "prompt_digest", "expected", "answer", "correct"]


def _gate(cfg, model, gate):
    out = Outcome()
    with measured(cfg, model, False, out) as target:
        asyncio.run(run_accuracy(target, gate, outcome=out))
    return out


def _cli(cfg_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg_path), *args],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))


@pytest.fixture(scope="module")
def measured_score(campaign_config, llama, campaign_home, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("questions")
    f = write(tmp / "arith.jsonl", arithmetic(SEED, N))
    with pytest.MonkeyPatch.context() as mp:  # before the per-test fixtures: say where, as they would
        mp.setenv("SERVEDECK_HOME", str(campaign_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp / "results"))
        out = _gate(campaign_config, "smollm2", ExactGate(path=f, threshold=0.0))
    acc = load(out.folder)["gate"]["accuracy"]["eval"]
    print(f"\nMEASURED {acc['kind']} on llama.cpp: score {acc['result']['score']:.3f} "
          f"({acc['result']['correct']}/{N}), gate wall time {acc.get('wall_s')} s")
    return f, out.folder, load(out.folder)


def test_the_measured_gate_writes_one_sample_line_per_question(measured_score):
    f, folder, view = measured_score
    lines = [json.loads(x) for x in (folder / "eval.jsonl").read_text().splitlines()]
    assert len(lines) == N
    assert sorted(x["id"] for x in lines) == sorted(f"q{i}" for i in range(N))
    for x in lines:
        assert list(x)[:5] == SAMPLE_KEYS
    expected = {q["id"]: str(q["answer"]) for q in arithmetic(SEED, N)}
    assert all(x["expected"] == expected[x["id"]] for x in lines)
    assert len({x["prompt_digest"] for x in lines}) == N  # one digest per distinct question


def test_the_measured_score_is_rebuilt_from_the_sample_lines(measured_score):
    _, folder, view = measured_score
    acc = view["gate"]["accuracy"]["eval"]
    lines = [json.loads(x) for x in (folder / "eval.jsonl").read_text().splitlines()]
    assert acc["result"]["correct"] == sum(x["correct"] for x in lines)
    assert acc["status"] == "passed" and view["gate"]["status"] == "passed"  # threshold 0
    assert view["kind"] == "gate" and view["status"] == "ok"
    # SmolLM2-135M is no calculator: some right, many wrong (0.25 of 40 such questions when first measured)
    assert 0.05 < acc["result"]["score"] < 0.8, acc["result"]


def test_cli_passes_just_below_the_measured_score(campaign_config, measured_score):
    f, _, view = measured_score
    below, _ = thresholds_around(view["gate"]["accuracy"]["eval"]["result"]["score"], "the exact gate on llama.cpp")
    r = _cli(campaign_config.path, "gate", "smollm2", "--eval", str(f), "--threshold", str(below))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GATE eval score= " in r.stdout and "gate passed" in r.stdout


def test_cli_fails_just_above_the_measured_score(campaign_config, measured_score):
    f, _, view = measured_score
    _, above = thresholds_around(view["gate"]["accuracy"]["eval"]["result"]["score"], "the exact gate on llama.cpp")
    r = _cli(campaign_config.path, "gate", "smollm2", "--eval", str(f), "--threshold", str(above),
             "--limit", str(N), "--concurrency", "4")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gate failed" in r.stdout


def test_a_question_whose_request_fails_is_counted_as_an_error(campaign_config, llama, tmp_path):
    # a prompt past the slot's 8192 tokens: llama-server refuses the request (HTTP 400)
    rows = arithmetic(SEED, 3) + [{"id": "too-long", "prompt": "word " * 12000 + "What is 2 plus 2?", "answer": 4,
                                   "match": "number"}]
    out = _gate(campaign_config, "smollm2", ExactGate(path=write(tmp_path / "q.jsonl", rows), threshold=0.0))
    acc = load(out.folder)["gate"]["accuracy"]["eval"]
    assert acc["result"]["errors"] == 1
    assert acc["result"]["samples"] == 4  # counted, not dropped
    bad = [json.loads(x) for x in (out.folder / "eval.jsonl").read_text().splitlines() if "too-long" in x]
    assert bad[0]["correct"] is False and bad[0]["error"].startswith("HTTP 4")


def test_cli_says_how_many_requests_failed(campaign_config, llama, tmp_path):
    rows = [{"id": "too-long", "prompt": "word " * 12000 + "What is 2 plus 2?", "answer": 4, "match": "number"}]
    r = _cli(campaign_config.path, "gate", "smollm2", "--eval", str(write(tmp_path / "q.jsonl", rows)),
             "--threshold", "0")
    assert "1 errors" in r.stdout and "1 questions failed to get an answer" in r.stdout, r.stdout + r.stderr


def test_a_plain_bench_after_an_accuracy_gate_cites_it(campaign_config, llama, tmp_path):
    # gated at 1.0 the questions fail (SmolLM2-135M is no calculator): the bench's figures on this same launch
    # must then be marked not a result, and the bench must say which gate run it stands on
    f = write(tmp_path / "q.jsonl", arithmetic(SEED, 6))
    g = _cli(campaign_config.path, "gate", "smollm2", "--eval", str(f), "--threshold", "1")
    assert g.returncode == 1, g.stdout + g.stderr
    r = _cli(campaign_config.path, "bench", "smollm2", "--no-gate", "--concurrency", "1", "--requests", "2",
             "--warmup", "0", "--input-tokens", "64", "--output-tokens", "4", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    gate_run = [ln.split("run folder: ", 1)[1].strip() for ln in g.stderr.splitlines() if "run folder: " in ln][0]
    acc = view["gate"]["accuracy"]["eval"]
    assert acc["source"] == os.path.basename(gate_run)
    assert acc["status"] == "failed" and view["gate"]["status"] == "failed"
    assert view["label"].endswith("gate failed: not a result")
