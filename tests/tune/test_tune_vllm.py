"""`servedeck tune` on vLLM's CPU build (SmolLM2 in HF layout): the starter, then a search over `max-num-seqs` and
`max-num-batched-tokens` with `dtype` in the space beside them, run end to end. The space holds an output-changing
flag on purpose: the starter runs float32, and a trial that samples bfloat16 answers the fixed greedy prompts with
other tokens, so the reference check (the campaign's own: workloads/outputs.compare_runs against the starter's
outputs) refuses it: verdict `outputs-differ`, told to the study as pruned, with the reason recorded.

Which trial samples which dtype was read off the sampler before this test ran: with seed 4 and both trials drawn at
random (startup = 2; the starter, told to the study at its float32, is not counted among them), t1 is float32 (max-num-seqs 2, max-num-batched-tokens 1935) and t2 bfloat16 (4, 259); the
first test says so if Optuna ever draws otherwise. Three vLLM boots in all, one at a time (each trial stops its
engine before the next boots); no verification (verify = false: its repeats would be four boots more here, and
tests/tune/test_tune_llamacpp.py verifies on llama.cpp). Kept short: a one-probe needle at 512 tokens (threshold 0),
four output-check prompts of 32 tokens, 64-token prompts, 8-token answers, two requests a step, `max = 2`."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import sys

import pytest

from ports import starter_toml
from shared_servers import SESSION, TEST_MARK

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.timeout(3600)]

SERVEDECK = [sys.executable, "-m", "servedeck"]

TUNE = """
[campaign]
name = "vtune"
model = "smollm2-vllm"
cell_timeout = "20m"
gate = { context = 512, depths = [0.5], repeats = 1, threshold = 0 }
reference_prompts = 4
reference_tokens = 32

[slo.chat]
ttft_p50 = "10m"
error_rate = "0%"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["chat"]
input_tokens = 64
output_tokens = 8
requests = 2
warmup = 0
max = 2

[search]
trials = 2
startup = 2
seed = 4
verify = false

[search.space]
"args.max-num-seqs" = [2, 4]
"args.max-num-batched-tokens" = { low = 256, high = 2048, log = true }
"args.dtype" = ["float32", "bfloat16"]
"""


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, engines_ready):
    from tests.conftest import stop_everything

    tmp = tmp_path_factory.mktemp("vtune")
    (tmp / "models.toml").write_text(starter_toml())
    (tmp / "search.toml").write_text(TUNE)
    env = {**os.environ, "SERVEDECK_HOME": str(tmp / "home"), "SERVEDECK_RESULTS": str(tmp / "results"),
           "SERVEDECK_CONFIG": str(tmp / "models.toml"), TEST_MARK: SESSION}
    try:
        r = subprocess.run(SERVEDECK + ["tune", str(tmp / "search.toml"), "--json"], env=env, cwd=tmp,
                           capture_output=True, text=True, timeout=4000)
        yield {"tmp": tmp, "run": r, "env": env}
    finally:
        stop_everything(tmp / "home")


def _doc(tuned) -> dict:
    r = tuned["run"]
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_the_tune_runs_end_to_end_over_the_scheduler_flags(tuned):
    doc = _doc(tuned)
    trials = {t["trial"]: t for t in doc["trials"]}
    assert set(trials) == {"starter", "t1", "t2"} and doc["finished"]
    assert trials["t1"]["values"] == {"args.max-num-seqs": 2, "args.max-num-batched-tokens": 1935,
                                      "args.dtype": "float32"}, "the sampler drew otherwise than read before"
    assert trials["t2"]["values"]["args.dtype"] == "bfloat16"
    starter, t1 = trials["starter"], trials["t1"]
    assert starter["outputs"]["check"] == "reference" and starter["row"]["gate"] == "passed"
    assert starter["verdict"] == "measured" and starter["value"] > 0, starter
    # float32 with other scheduler limits: the same answers, a figure of its own
    assert t1["outputs"]["check"] == "identical", t1["outputs"]
    assert t1["verdict"] == "measured" and t1["value"] > 0 and t1["row"]["gate"] == "passed", t1
    assert doc["verification"] is None and doc["best"]["verdict"] in ("recommended", "undecided")


def test_the_trial_that_changed_dtype_is_refused_by_the_reference_check_with_its_reason(tuned):
    doc = _doc(tuned)
    t2 = next(t for t in doc["trials"] if t["trial"] == "t2")
    assert t2["outputs"]["check"] == "differs", t2["outputs"]
    assert (t2["verdict"], t2["tell"]) == ("outputs-differ", "pruned"), t2
    assert "greedy outputs differ from the starter's" in t2["why"]
    assert t2["outputs"]["identical"] < t2["outputs"]["prompts"] == 4
    assert t2["trial"] not in (doc["best"].get("best"), doc["best"].get("leading"))
    md = (tuned["tmp"] / "results" / "tunes").glob("vtune__*/tune.md")
    assert "outputs-differ" in next(md).read_text()


def test_the_trial_that_changed_dtype_was_stopped_at_its_output_check_before_any_capacity_step(tuned):
    """campaign.reference_run (the starter's run, set by the tune): t2's cell ends as soon as its 4 prompts are
    answered; no capacity search is started, so the refusal cost a boot, the gate and the check only."""
    doc = _doc(tuned)
    t2 = next(t for t in doc["trials"] if t["trial"] == "t2")
    assert "stopped there, before its capacity search" in t2["why"] and t2["row"] is None, t2
    camp = json.loads((tuned["tmp"] / "results" / "campaigns" / t2["campaign"] / "campaign.json").read_text())
    [cell] = camp["cells"]
    assert cell["state"] == "failed" and cell["stopped_by"] == "reference_run", cell
    assert "(campaign.reference_run)" in cell["reason"] and cell["not_started"] == ["capacity"], cell
    runs = tuned["tmp"] / "results" / "runs"
    kinds = [json.loads((runs / r / "summary.json").read_text()).get("kind") for r in t2["runs"]]
    assert "capacity" not in kinds and len(t2["runs"]) == 2, (kinds, t2["runs"])  # the gate's run, the check's
    assert (runs / t2["runs"][-1] / "outputs.jsonl").exists()


def test_the_study_was_told_each_verdict(tuned):
    doc = _doc(tuned)
    folder = next((tuned["tmp"] / "results" / "tunes").glob("vtune__*"))
    db = sqlite3.connect(folder / "study.db")
    states = dict(db.execute("select number, state from trials").fetchall())
    db.close()
    # number 0 is the starter, told at its entry's dtype (the one knob its entry sets; vLLM declares no defaults)
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "PRUNED"}, (states, [t["verdict"] for t in doc["trials"]])
    assert doc["starter_point"] == {"args.dtype": "float32"} and doc["study_offset"] == 1


def test_the_flags_reached_vllm(tuned):
    """Each trial's values on vLLM's own command line, as the run folder keeps it (cmd.sh, copied at launch)."""
    doc = _doc(tuned)
    runs = tuned["tmp"] / "results" / "runs"
    for name in ("t1", "t2"):
        t = next(t for t in doc["trials"] if t["trial"] == name)
        cmds = [runs / r / "cmd.sh" for r in t["runs"] if (runs / r / "cmd.sh").exists()]
        assert cmds, (name, t["runs"])
        words = shlex.split(cmds[0].read_text().replace("\\\n", " "), comments=True)
        for key, value in t["values"].items():
            flag = "--" + key.split(".", 1)[1]
            assert flag in words and words[words.index(flag) + 1] == str(value), (name, flag, words)
