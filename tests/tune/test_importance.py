"""`servedeck tune show`'s importance of each searched entry, from a study in SQLite as a tune leaves it: only
complete trials count, too few say so instead of a table of equal shares. The study's values were chosen so one
entry decides the objective (parallel) and the other barely moves it (batch-size)."""

from __future__ import annotations

import json

import optuna
from typer.testing import CliRunner

from servedeck.cli import root_app
from servedeck.tune.importance import importance
from servedeck.tune.storage import for_resume


def _importance(folder):
    return importance(optuna, for_resume(folder, {"name": "imp"}, None))


def _fixed(folder, rows):
    study = optuna.create_study(storage=f"sqlite:///{folder / 'study.db'}", study_name="imp", direction="maximize",
                                load_if_exists=True)
    for parallel, batch, state in rows:
        study.enqueue_trial({"args.parallel": parallel, "args.batch-size": batch})
        t = study.ask()
        p = t.suggest_categorical("args.parallel", [1, 2, 4])
        b = t.suggest_int("args.batch-size", 64, 512, log=True)
        if state == "pruned":
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(t, p * 1.0 + b / 100_000)


ROWS = [(1, 64, "complete"), (4, 70, "complete"), (2, 500, "complete"), (1, 400, "complete"),
        (4, 300, "complete"), (2, 100, "complete"), (4, 64, "pruned")]


def test_the_entry_that_decides_the_objective_comes_first(tmp_path):
    _fixed(tmp_path, ROWS)
    imp = _importance(tmp_path)
    assert imp["trials"] == 6 and imp["note"] is None  # the pruned one does not count
    assert list(imp["importance"]) == ["args.parallel", "args.batch-size"]
    assert imp["importance"]["args.parallel"] > 0.8


def test_the_starter_told_to_the_study_with_fewer_knobs_is_not_explained(tmp_path):
    # the tune tells the study the starter's figure at the knobs its entry has values for (here parallel only);
    # importance is over the searched trials, so batch-size stays in it and the trial count leaves the starter out
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="imp", direction="maximize")
    study.add_trial(optuna.trial.create_trial(
        params={"args.parallel": 4}, value=9.0, user_attrs={"servedeck": "starter"},
        distributions={"args.parallel": optuna.distributions.CategoricalDistribution([1, 2, 4])}))
    _fixed(tmp_path, ROWS)
    imp = _importance(tmp_path)
    assert imp["trials"] == 6 and set(imp["importance"]) == {"args.parallel", "args.batch-size"}


def test_too_few_complete_trials_say_so(tmp_path):
    _fixed(tmp_path, ROWS[:2] + [(4, 64, "pruned")])
    imp = _importance(tmp_path)
    assert imp["importance"] == {} and "2 trial(s) told complete" in imp["note"]


def test_tune_show_prints_the_trials_and_the_importance(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    folder = tmp_path / "results" / "tunes" / "imp__1206-120000"
    folder.mkdir(parents=True)
    _fixed(folder, ROWS)
    doc = {"schema": 2, "name": "imp", "file": "x.toml", "model": "smollm2", "slo": "chat", "trials": [],
           "best": None, "verification": None, "budget": {"trials": 6}}
    (folder / "tune.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(root_app, ["tune", "show", "imp", "--json"])
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.stdout)["importance"]["importance"]) == ["args.parallel", "args.batch-size"]
    r = CliRunner().invoke(root_app, ["tune", "show"])
    assert r.exit_code == 0 and "Importance of each searched entry" in r.stdout and "args.parallel" in r.stdout


def test_tune_md_shows_the_importance_the_search_ended_with():
    from servedeck.tune.folder import render_markdown

    doc = {"name": "imp", "trials": [], "best": None, "verification": None, "budget": {"trials": 6},
           "importance": {"evaluator": "fANOVA (optuna.importance.FanovaImportanceEvaluator, seed 0)", "trials": 6,
                          "importance": {"args.parallel": 0.91, "args.batch-size": 0.09}, "note": None}}
    md = render_markdown(doc)
    assert "## Importance of each searched entry" in md and "| args.parallel | 0.91 |" in md
    assert "Importance" not in render_markdown({**doc, "importance": None})
