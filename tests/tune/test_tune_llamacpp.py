"""`servedeck tune` on real llama.cpp (SmolLM2): the starter, then a search over `parallel`, `batch-size` and
`ubatch-size`, each trial a campaign cell (launch, gate, output check against the starter, capacity search under the
SLO, stop). The tune is interrupted (SIGINT to its process group, as Ctrl-C in a terminal) once the starter has its
verdict and the first searched trial is under way, then resumed: the starter is kept as it was (not launched again),
the cut-short trial is redone with the same values as a new trial, and no engine is left running between the two.
Then the verification: t2 (the one searched trial with a figure) and the starter launched again, twice each,
interleaved (starter, t2, starter, t2), each repeat's figure recorded, and `tune apply` following its verdict.
Seven launches in all.

Kept short for a loaded 2-core machine: a one-probe needle at 512 tokens (threshold 0: the gate runs and is recorded,
whether SmolLM2 finds one code is the gate tests' concern), 64-token prompts, 8-token answers, two requests a step,
`max = 2`, one output-check prompt of 4 tokens. cell_timeout is 20 minutes, a limit on throughput, not a race: on
2026-12-06, with a load average near 50 on this 2-core machine, llama-server evaluated prompts at 0.2 to 8 tokens/s
and one starter launch (boot 2.5 min, the gate's probe 6 min) passed a 10-minute cell_timeout. The same day, as
the load fell from about 40 to 12, this file passed whole in 539 s; with the verification's four launches added it
passed in 569 s (load average near 10), after a first try had passed pytest's default 900 s limit just as its last
launch ended: hence the module's own limit."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ports import starter_toml
from shared_servers import SESSION, TEST_MARK

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp, pytest.mark.timeout(3600)]

SERVEDECK = [sys.executable, "-m", "servedeck"]

TUNE = """
[campaign]
name = "smoltune"
model = "smollm2"
cell_timeout = "20m"
gate = { context = 512, depths = [0.5], repeats = 1, threshold = 0 }
reference_prompts = 1
reference_tokens = 4

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
trials = 1
seed = 3
verify = { top = 1, repeats = 2 }
require = ["args.ubatch-size <= args.batch-size"]

[search.space]
"args.parallel" = [1, 2]
"args.batch-size" = { low = 64, high = 512, log = true }
"args.ubatch-size" = { low = 32, high = 256, log = true }
"""


def _doc(folder: Path) -> dict:
    return json.loads((folder / "tune.json").read_text())


def _running_engines(env: dict) -> list:
    r = subprocess.run(SERVEDECK + ["status", "--json"], capture_output=True, text=True, env=env, timeout=120)
    rows = json.loads(r.stdout)
    rows = rows.get("models", rows) if isinstance(rows, dict) else rows
    return [m for m in rows if (m.get("state") or "").lower() not in ("", "stopped", "not running")]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, engines_ready):
    from tests.conftest import stop_everything

    tmp = tmp_path_factory.mktemp("tune")
    (tmp / "models.toml").write_text(starter_toml())
    (tmp / "search.toml").write_text(TUNE)
    env = {**os.environ, "SERVEDECK_HOME": str(tmp / "home"), "SERVEDECK_RESULTS": str(tmp / "results"),
           "SERVEDECK_CONFIG": str(tmp / "models.toml"), TEST_MARK: SESSION}  # the session guard sees its engines
    try:
        # first session: interrupted once the starter has its verdict and t1 is launched (Ctrl-C: SIGINT to the
        # whole process group)
        first = subprocess.Popen(SERVEDECK + ["tune", str(tmp / "search.toml")], env=env, cwd=tmp,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        root, deadline, folder = tmp / "results" / "tunes", time.monotonic() + 1800, None
        while time.monotonic() < deadline and first.poll() is None:
            found = list(root.glob("smoltune__*")) if root.exists() else []
            if found and (found[0] / "tune.json").exists():
                folder = found[0]
                t1 = next((t for t in _doc(folder)["trials"] if t["trial"] == "t1"), None)
                if t1 is not None and t1["campaign"]:
                    break
            time.sleep(0.1)
        assert first.poll() is None, "the tune ended before it could be interrupted:\n" + first.communicate()[1][-3000:]
        os.killpg(first.pid, signal.SIGINT)
        out, err = first.communicate(timeout=120)
        assert folder is not None
        interrupted = _doc(folder)
        engines_between = _running_engines(env)
        # second session: resumed to the end of its budget
        second = subprocess.run(SERVEDECK + ["tune", str(tmp / "search.toml"), "--resume", "--json"], env=env,
                                cwd=tmp, capture_output=True, text=True, timeout=3000)
        yield {"tmp": tmp, "folder": folder, "first_rc": first.returncode, "first_err": err,
               "interrupted": interrupted, "engines_between": engines_between, "second": second, "env": env}
    finally:
        stop_everything(tmp / "home")


def test_ctrl_c_ends_the_tune_with_the_running_trial_marked_and_no_engine_left(tuned):
    assert tuned["first_rc"] == 130, tuned["first_err"][-3000:]
    trials = {t["trial"]: t for t in tuned["interrupted"]["trials"]}
    assert trials["starter"]["state"] == "done" and trials["t1"]["state"] == "interrupted"
    assert "--resume" in trials["t1"]["why"]
    assert tuned["engines_between"] == []


def test_resume_keeps_finished_trials_and_redoes_only_the_cut_short_one(tuned):
    second = tuned["second"]
    assert second.returncode == 0, second.stderr[-3000:]
    before = {t["trial"]: t for t in tuned["interrupted"]["trials"]}
    doc = json.loads(second.stdout)
    after = {t["trial"]: t for t in doc["trials"]}
    assert after["starter"] == before["starter"]  # kept exactly: not launched again
    assert after["t1"]["state"] == "interrupted" and after["t1"]["redone"]
    assert after["t2"]["redoes"] == "t1" and after["t2"]["values"] == before["t1"]["values"]
    assert after["t2"]["state"] == "done" and doc["finished"] and set(after) == {"starter", "t1", "t2"}
    # every launch made one campaign folder: the starter's once; the verification's one
    campaigns = sorted(p.name.split("__")[0] for p in (tuned["tmp"] / "results" / "campaigns").iterdir())
    assert campaigns == ["smoltune.starter", "smoltune.t1", "smoltune.t2", "smoltune.verify"]


def test_each_trial_has_its_figure_or_why_and_its_output_check(tuned):
    doc = json.loads(tuned["second"].stdout)
    starter, t2 = doc["trials"][0], doc["trials"][-1]
    assert starter["trial"] == "starter" and starter["outputs"]["check"] == "reference"
    assert starter["row"]["gate"] == "passed" and starter["row"]["slo"] == "chat"
    for t in (starter, t2):
        assert t["verdict"] in ("measured", "no-capacity", "outputs-differ", "failed"), t
        if t["verdict"] == "measured":
            assert t["value"] > 0 and t["campaign"].startswith("smoltune.")
        else:
            assert t["why"]
    assert t2["outputs"]["check"] in ("identical", "differs", "not comparable")
    assert doc["best"]["verdict"] in ("recommended", "undecided", "none")


def test_the_study_holds_every_trial_with_what_it_was_told(tuned):
    doc = json.loads(tuned["second"].stdout)
    db = sqlite3.connect(tuned["folder"] / "study.db")
    states = dict(db.execute("select number, state from trials").fetchall())
    db.close()
    told = {t["number"]: {"complete": "COMPLETE", "pruned": "PRUNED"}.get(t.get("tell"), "FAIL")
            for t in doc["trials"] if t["trial"] != "starter"}
    assert states == told and told[0] == "FAIL"  # t1, cut short, is told failed; t2 what its verdict says


def test_tune_md_shows_the_trials_and_the_best(tuned):
    md = (tuned["folder"] / "tune.md").read_text()
    assert "## Trials" in md and "| starter |" in md and "| t2 |" in md
    assert ("Best so far" in md) or ("Undecided" in md) or ("No trial has a figure" in md)


def test_the_best_trial_and_the_starter_were_launched_again_interleaved_and_each_repeat_recorded(tuned):
    doc = json.loads(tuned["second"].stdout)
    t2 = next(t for t in doc["trials"] if t["trial"] == "t2")
    assert t2["verdict"] == "measured" and t2["value"] > 0, t2  # else nothing is verified: say why t2 had no figure
    ver = doc["verification"]
    assert ver["state"] == "done" and ver["candidates"] == ["t2"] and ver["repeats"] == 2
    assert ver["order"] == ["starter#1", "t2#1", "starter#2", "t2#2"]  # interleaved, not back to back
    camp = json.loads(next((tuned["tmp"] / "results" / "campaigns").glob("smoltune.verify__*"))
                      .joinpath("campaign.json").read_text())
    assert camp["reference"] == "starter" and [c["id"] for c in camp["cells"]] == ver["order"]
    started = sorted(camp["cells"], key=lambda c: c["started"])
    assert [c["id"] for c in started] == ver["order"]  # launched in that order
    for name in ("starter", "t2"):
        figs = ver["figures"][name]
        assert [f["repeat"] for f in figs] == [1, 2]
        for f in figs:  # each repeat: its run folder and its figure, or why it has none
            assert f["runs"] and ((f["value"] is not None) or f["why"]), f
    assert ver["verdict"] in ("verified", "not held", "undecided", "no baseline")
    assert ver["trials"]["t2"]["outcome"] in ("holds", "within the spread", "below the starter", "outputs differ",
                                              "too few")
    assert "## Verification" in (tuned["folder"] / "tune.md").read_text()
    # tune apply follows the verification: the winner where one held, else a refusal naming what to do
    r = subprocess.run(SERVEDECK + ["tune", "apply", "--dry-run", "--json"], capture_output=True, text=True,
                       env=tuned["env"], cwd=tuned["tmp"], timeout=120)
    if ver["verdict"] == "verified":
        assert r.returncode == 0 and json.loads(r.stdout)["trial"] == ver["winner"], r.stderr
    else:
        assert r.returncode != 0 and f"no verified winner (verification {ver['verdict']})" in r.stderr, r.stderr


def test_no_engine_is_left_running_after_the_tune(tuned):
    assert _running_engines(tuned["env"]) == []
