"""How much each searched entry moved the objective, from the study (Optuna's own evaluator over study.db or the
database the tune named: storage.py), for `servedeck tune show` and tune.md. Only trials told `complete`
(measured, or no load within the SLO: 0) count; pruned ones have no value to explain. Read from the study, never
measured again."""

from __future__ import annotations

import warnings
from typing import Any, Optional

from servedeck.errors import RunError
from servedeck.tune.storage import StudyAt, open_existing

MIN_TRIALS = 3  # below this Optuna's evaluators say every entry is equally important, which is no information


def _empty(note: Optional[str] = None) -> dict[str, Any]:
    """A fresh answer with nothing to say yet (a new dict each time: callers may fill its `importance`)."""
    return {"evaluator": None, "trials": 0, "importance": {}, "note": note}


def importance(optuna: Any, at: StudyAt) -> dict[str, Any]:
    """{"evaluator", "trials" (complete ones), "importance" ({entry: share of the objective's variance}, largest
    first; {} when there is too little to say), "note" (why not, or None)}, from the study where it is stored."""
    try:
        study = open_existing(optuna, at)
    except RunError as e:
        return _empty(e.message)
    if study is None:
        return _empty("no study.db in the tune folder" if at.in_folder else f"no study {at.name!r} in {at.shown}")
    return of_study(optuna, study)


def of_study(optuna: Any, study: Any) -> dict[str, Any]:
    """importance's answer from a study already open (the tune's own, at the end of its search)."""
    out = _empty()
    # the starter told to the study (runner._starter_to_study) has only the knobs its entry gives a value for:
    # fANOVA reads the knobs every trial has, so it would drop the rest; the searched trials alone are explained
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("servedeck") != "starter"]
    out["trials"] = len(done)
    if len(done) < MIN_TRIALS:
        return {**out, "note": f"{len(done)} trial(s) told complete (measured or no-capacity); importance needs "
                               f"{MIN_TRIALS} or more"}
    if len({tuple(sorted(t.params.items())) for t in done}) < 2:
        return {**out, "note": "every complete trial took the same values"}
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
    searched = optuna.create_study(direction=study.direction)  # in memory: the searched trials only
    searched.add_trials(done)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = optuna.importance.get_param_importances(searched, evaluator=evaluator)
        except (RuntimeError, ValueError) as e:  # a study Optuna's evaluator cannot explain: said, not raised
            return {**out, "note": f"Optuna's evaluator could not explain these trials ({e})"}
    return {**out, "evaluator": "fANOVA (optuna.importance.FanovaImportanceEvaluator, seed 0)",
            "importance": {k: round(float(v), 3) for k, v in got.items()}}
