"""The lm-eval gate: a generative task (arithmetic this test writes, as a local JSON task) through
lm-eval's local-chat-completions against real llama.cpp; and what is refused before any launch."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from questions import arithmetic, lm_eval_task, thresholds_around
from servedeck.workloads.session import run_accuracy
from servedeck.workloads.session import Outcome, measured
from servedeck.errors import UsageError
from servedeck.gates.lmeval import LmEvalGate
from servedeck.runs import load

def _launches() -> set:
    """Every launch folder under this test's home (the shared servers' are there too)."""
    from pathlib import Path
    return {str(p) for p in (Path(os.environ["SERVEDECK_HOME"]) / "launches").glob("*/*")}


N = 24
SEED = 29


def _gate(cfg, model, gate):
    out = Outcome()
    with measured(cfg, model, False, out) as target:
        asyncio.run(run_accuracy(target, gate, outcome=out))
    return out


def test_an_unknown_task_is_refused_naming_the_tasks_there(tmp_path):
    d = lm_eval_task(tmp_path / "tasks", "arith", arithmetic(1, 3))
    with pytest.raises(UsageError) as e:
        LmEvalGate(task="gsm8k", task_dir=d, threshold=0.5).check("llamacpp")
    assert f"no task named 'gsm8k' in {d}" in e.value.message and "arith" in e.value.hint


def test_a_loglikelihood_task_on_llamacpp_is_refused_saying_why(tmp_path):
    d = lm_eval_task(tmp_path / "tasks", "mc", arithmetic(1, 3), output_type="multiple_choice")
    with pytest.raises(UsageError) as e:
        LmEvalGate(task="mc", task_dir=d, threshold=0.5).check("llamacpp")
    assert "is a multiple_choice task" in e.value.message
    assert "llama-server returns no prompt logprobs" in e.value.message


def test_a_task_reading_from_the_hub_is_refused(tmp_path):
    d = lm_eval_task(tmp_path / "tasks", "arith", arithmetic(1, 3))
    f = d / "arith.yaml"
    f.write_text(f.read_text().replace("dataset_path: json", "dataset_path: openai/gsm8k"))
    with pytest.raises(UsageError) as e:
        LmEvalGate(task="arith", task_dir=d, threshold=0.5).check("llamacpp")
    assert "dataset_path is 'openai/gsm8k'; expected json with local data_files" in e.value.message


def test_a_missing_data_file_is_refused(tmp_path):
    d = lm_eval_task(tmp_path / "tasks", "arith", arithmetic(1, 3))
    (d / "arith.jsonl").unlink()
    with pytest.raises(UsageError) as e:
        LmEvalGate(task="arith", task_dir=d, threshold=0.5).check("llamacpp")
    assert "data_files not found" in e.value.message and "arith.jsonl" in e.value.message


def test_cli_refuses_a_loglikelihood_task_before_any_launch(tmp_path, deck_config):
    before = _launches()
    d = lm_eval_task(tmp_path / "tasks", "mc", arithmetic(1, 3), output_type="loglikelihood")
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(deck_config.path), "gate", "smollm2",
                        "--eval", "lm-eval:mc", "--task-dir", str(d), "--threshold", "0.5", "--launch"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "llama-server returns no prompt logprobs" in r.stderr
    assert _launches() == before, "a launch was attempted"


@pytest.fixture(scope="module")
def lm_measured(campaign_config, llama, campaign_home, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    d = lm_eval_task(tmp / "tasks", "arith", arithmetic(SEED, N))
    with pytest.MonkeyPatch.context() as mp:  # before the per-test fixtures: say where, as they would
        mp.setenv("SERVEDECK_HOME", str(campaign_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp / "results"))
        out = _gate(campaign_config, "smollm2", LmEvalGate(task="arith", task_dir=d, threshold=0.0, concurrency=4))
    acc = load(out.folder)["gate"]["accuracy"]["eval"]
    print(f"\nMEASURED {acc['kind']} on llama.cpp: score {acc['result']['score']:.3f} "
          f"({acc['result']['correct']}/{N}), gate wall time {acc.get('wall_s')} s")
    return d, out.folder, load(out.folder)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_lm_evals_own_files_stay_in_the_run_folder(lm_measured):
    _, folder, _ = lm_measured
    samples = list((folder / "lm-eval").rglob("samples_arith_*.jsonl"))
    results = list((folder / "lm-eval").rglob("results_*.json"))
    assert len(samples) == 1 and len(results) == 1
    assert len(samples[0].read_text().splitlines()) == N


@pytest.mark.engine
@pytest.mark.llamacpp
def test_each_lm_eval_sample_is_one_eval_line_scored_as_lm_eval_scored_it(lm_measured):
    _, folder, view = lm_measured
    lines = [json.loads(x) for x in (folder / "eval.jsonl").read_text().splitlines()]
    assert len(lines) == N and all(x["metric"] == "exact_match" for x in lines)
    acc = view["gate"]["accuracy"]["eval"]
    # servedeck's share of samples scored 1 is lm-eval's own exact_match for the task
    assert acc["result"]["score"] == pytest.approx(acc["result"]["lm_eval"]["exact_match,last-number"])
    assert acc["status"] == "passed"  # threshold 0


@pytest.mark.engine
@pytest.mark.llamacpp
def test_cli_lm_eval_gate_fails_above_the_measured_score(campaign_config, lm_measured):
    d, _, view = lm_measured
    _, above = thresholds_around(view["gate"]["accuracy"]["eval"]["result"]["score"], "the lm-eval gate on llama.cpp")
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(campaign_config.path), "gate", "smollm2",
                        "--eval", "lm-eval:arith", "--task-dir", str(d), "--threshold", str(above),
                        "--concurrency", "4"], capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "GATE eval score= " in r.stdout and "gate failed" in r.stdout


@pytest.mark.engine
@pytest.mark.llamacpp
def test_lm_eval_gate_passes_below_the_measured_score(campaign_config, lm_measured):
    d, _, view = lm_measured
    below, _ = thresholds_around(view["gate"]["accuracy"]["eval"]["result"]["score"], "the lm-eval gate on llama.cpp")
    out = _gate(campaign_config, "smollm2", LmEvalGate(task="arith", task_dir=d, threshold=below,
                                                       concurrency=4))
    assert load(out.folder)["gate"]["accuracy"]["eval"]["status"] == "passed"


@pytest.mark.engine
@pytest.mark.llamacpp
def test_an_lm_eval_sample_whose_request_fails_is_counted_as_an_error(campaign_config, llama, tmp_path):
    # a prompt past the slot's 8192 tokens: llama-server refuses that one request (HTTP 400); lm-eval alone
    # would stop the whole run there
    rows = arithmetic(SEED, 3) + [{"id": "too-long", "prompt": "word " * 12000 + "What is 2 plus 2?", "answer": 4}]
    d = lm_eval_task(tmp_path / "tasks", "arith", rows)
    out = _gate(campaign_config, "smollm2", LmEvalGate(task="arith", task_dir=d, threshold=0.0, concurrency=2))
    acc = load(out.folder)["gate"]["accuracy"]["eval"]
    assert acc["result"]["samples"] == 4  # counted, not dropped
    assert acc["result"]["errors"] == 1
    bad = [json.loads(x) for x in (out.folder / "eval.jsonl").read_text().splitlines() if '"error"' in x]
    assert len(bad) == 1 and bad[0]["correct"] is False and bad[0]["error"].startswith("HTTP 400"), bad


def test_whether_an_engine_returns_prompt_logprobs_is_its_adapters_word(tmp_path, monkeypatch):
    """Issue 31 item 15: the gate compared the engine's name (`engine == "llamacpp"`), so a llama.cpp fork
    registered under its own name got vLLM's reason. The fact is the adapter's (`no_prompt_logprobs`)."""
    import servedeck.engines as E
    from servedeck.engines.llamacpp import LlamaCpp

    class LlamaFork(LlamaCpp):
        name = "llamafork"

    monkeypatch.setitem(E._load(), "llamafork", LlamaFork())
    d = lm_eval_task(tmp_path / "tasks", "mc", arithmetic(1, 3), output_type="multiple_choice")
    with pytest.raises(UsageError) as e:
        LmEvalGate(task="mc", task_dir=d, threshold=0.5).check("llamafork")
    assert "llama-server returns no prompt logprobs" in e.value.message
    with pytest.raises(UsageError) as e:
        LmEvalGate(task="mc", task_dir=d, threshold=0.5).check("vllm")
    assert "chat completions, which return no prompt logprobs" in e.value.message
