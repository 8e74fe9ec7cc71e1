"""A resume's bookkeeping, without an engine: a trial left `running` by a servedeck that is gone, or `interrupted` by
Ctrl-C, is told failed in the study and its values asked again first; a trial with a verdict is never asked again;
a trial asked but cut short before tune.json recorded it is told failed too. (The real llama.cpp test,
test_tune_llamacpp.py, does the same through SIGINT and `--resume`.)"""

from __future__ import annotations

import optuna

from servedeck.tune.file import parse
from servedeck.tune.runner import TuneRun

TUNE = """
[campaign]
name = "resumed"
model = "smollm2"
gate = { context = 512, depths = [0.5], repeats = 1 }

[slo.chat]
ttft_p50 = "10m"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["chat"]
input_tokens = 64
output_tokens = 8
requests = 2
max = 2

[search]
trials = 3
seed = 0
[search.space]
"args.parallel" = [1, 2, 4]
"args.batch-size" = { low = 64, high = 512, log = true }
"""


def _run(deck_config, tmp_path, resume: bool) -> TuneRun:
    (tmp_path / "search.toml").write_text(TUNE)
    return TuneRun(deck_config, parse(TUNE, tmp_path / "search.toml"), resume)


def test_a_cut_short_trial_is_failed_and_its_values_asked_again(deck_config, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    first = _run(deck_config, tmp_path, resume=False)
    study = first._study()
    f = first.folder
    f.begin_trial("starter", None, {}, None)
    f.update_trial("starter", state="done", verdict="measured", value=1.0, tell=None)
    done, cut, lost = study.ask(), study.ask(), study.ask()
    values = {n: first.tune.space.sample(t) for n, t in (("t1", done), ("t2", cut), ("t3", lost))}
    f.begin_trial("t1", done.number, values["t1"], None)
    f.update_trial("t1", state="done", verdict="measured", value=2.0, tell="complete")
    study.tell(done, 2.0)
    f.begin_trial("t2", cut.number, values["t2"], None)  # left running: its servedeck was killed
    # t3 was asked, then the servedeck died before tune.json recorded it

    again = _run(deck_config, tmp_path, resume=True)
    assert again.folder.path == f.path
    study = again._study()
    redo = again._recover(study)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[done.number] == optuna.trial.TrialState.COMPLETE
    assert states[cut.number] == states[lost.number] == optuna.trial.TrialState.FAIL
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1  # only the recorded cut-short trial
    nxt = study.ask()
    assert again.tune.space.sample(nxt) == values["t2"]  # asked again with its values
    assert list(redo.values()) == ["t2"]
    trials = {t["trial"]: t for t in again.folder.doc["trials"]}
    assert trials["t2"]["state"] == "interrupted" and trials["t2"]["redone"]
    assert "servedeck is gone" in trials["t2"]["why"]
    assert trials["t1"]["state"] == "done" and trials["starter"]["state"] == "done"
    assert again._finished() == 1  # the budget counts t1 only: t2 is redone, not spent
    # a second resume does not ask t2's values again
    assert again._recover(study) == {}


def test_values_already_measured_are_told_again_not_launched(deck_config, tmp_path, monkeypatch):
    """A proposal with a finished trial's values, or the starter's point where its entry gives every searched key,
    gets that trial's result without a launch (tune/objective.repeat_of); new values go on to a launch."""
    import servedeck.tune.runner as R

    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    launched: list[str] = []

    class NoLaunch:
        def __init__(self, cfg, camp, *a, **k):
            launched.append(camp.name)
            raise RuntimeError("launched")

    monkeypatch.setattr(R, "Runner", NoLaunch)
    run = _run(deck_config, tmp_path, resume=False)
    f = run.folder
    starter_point = run._starter_values()
    assert set(starter_point) == {"args.parallel", "args.batch-size"}  # the entry's slots, llama.cpp's -b default
    f.begin_trial("starter", None, {}, None)
    f.update_trial("starter", state="done", verdict="measured", value=1.5, tell="complete")
    f.begin_trial("t1", 1, {"args.parallel": 2, "args.batch-size": 100}, None)
    f.update_trial("t1", state="done", verdict="outputs-differ", tell="pruned")
    v = run._measure("t2", dict(starter_point))
    assert (v.verdict, v.tell, v.value) == ("repeated", "complete", 1.5) and "starter" in v.why
    v = run._measure("t3", {"args.batch-size": 100, "args.parallel": 2})
    assert (v.verdict, v.tell) == ("repeated", "pruned") and "t1" in v.why
    assert launched == []
    f.begin_trial("t4", 3, {"args.parallel": 1, "args.batch-size": 100}, None)
    try:
        run._measure("t4", {"args.parallel": 1, "args.batch-size": 100})
    except RuntimeError:
        pass
    assert launched == ["resumed.t4"]
