"""What one trial tells the search, and which trial leads, pure (nothing measured or launched here).

A trial ends in one of these verdicts (tune.json keeps the value; docs/tune.md says what each means):

    measured        its capacity search ran and its gate passed: the objective is its good requests/s per GPU
                    within the SLO at its capacity (a lower bound counts as its bound value, marked `bound`)
    no-capacity     no load searched met the SLO: objective 0 (a real figure: this region serves nobody)
    below-best      its capacity search stopped once no load could carry the best figure so far (the starter's or
                    a measured trial's, held to as its campaign's stop_below): its first failing load completed
                    fewer requests a second than that; pruned, its figure a bound whose ceiling is under the leader's,
                    so it never leads nor leaves the best undecided
    gate-failed     the gate did not pass: figures recorded, not a result; pruned
    outputs-differ  its greedy outputs differ from the starter's (unless outputs_may_differ); pruned. Its cell
                    stops at that check, before the capacity search (campaign.reference_run)
    broke-rule      the sampled values break a `require` rule; never launched; pruned
    invalid         models.toml's or the engine's rules refuse the sampled values; never launched; pruned
    no-fit          the planner says it cannot fit the GPUs; never launched; pruned
    failed          it did not boot, its server died, or its cell_timeout passed; pruned
    interrupted     Ctrl-C came mid-trial: `servedeck tune FILE --resume` redoes the same values
    repeated        its values are a finished trial's, or the starter's where its entry gives every searched
                    key: not launched again; the search is told that trial's result (a repeat of a point is
                    the verification's job, launched interleaved with the starter's, not the search's)

Pruned, not failed, is what tells Optuna's TPE the region is bad: it ranks pruned trials below every finished
one, where a failed trial is left out of its model altogether.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from servedeck.report.recommend import recommendations

MEASURED, NO_CAPACITY, BELOW_BEST = "measured", "no-capacity", "below-best"
GATE_FAILED, OUTPUTS_DIFFER, BROKE_RULE = "gate-failed", "outputs-differ", "broke-rule"
INVALID, NO_FIT, FAILED, INTERRUPTED = "invalid", "no-fit", "failed", "interrupted"
REPEATED = "repeated"
COMPLETE, PRUNED = "complete", "pruned"  # what the search is told (optuna TrialState names, lower case)
LAUNCHED = frozenset({MEASURED, NO_CAPACITY, BELOW_BEST, GATE_FAILED, OUTPUTS_DIFFER, FAILED, INTERRUPTED})


@dataclass(frozen=True)
class Verdict:
    verdict: str
    tell: Optional[str]  # COMPLETE | PRUNED | None (interrupted: the search is told nothing yet)
    value: Optional[float] = None  # the objective, for COMPLETE
    bound: bool = False  # the value is a lower bound (its search did not end `found`)
    why: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "tell": self.tell, "value": self.value, "bound": self.bound, "why": self.why}


def before_launch(broken: list[str], fits: list[dict[str, Any]]) -> Optional[Verdict]:
    """Whether a sampled variant is launched at all: None to launch it; else why not. `fits`: each replica's
    planner report (gpu/fit.py FitReport.to_json: status fits | no-room | unknown)."""
    if broken:
        return Verdict(BROKE_RULE, PRUNED, why="breaks " + "; ".join(broken))
    no_room = [f for f in fits if f.get("status") == "no-room"]
    if no_room:
        return Verdict(NO_FIT, PRUNED, why=str(no_room[0].get("message") or no_room[0].get("reason")))
    return None


def repeat_of(values: dict[str, Any], done: list[dict[str, Any]]) -> Optional[Verdict]:
    """Whether sampled values were already tried: the first of `done` (tune.json's finished trials, the starter's
    with its entry's value for every searched key, in the order they ran) with these very values and a result to
    repeat (not one refused before its launch, whose rules would refuse them again, nor an interrupted one) →
    a `repeated` verdict telling the search what that trial was told; else None. Pure. (On an H100 a search of
    four points drew the starter's again and measured +33 % for the same flags: launch-to-launch spread, which
    the verification measures, not a configuration.)"""
    for t in done:
        if t.get("values") != values or t.get("verdict") not in LAUNCHED - {INTERRUPTED} or t.get("tell") is None:
            continue
        figure = f"{t['value']:.3g}" if t.get("value") is not None else "pruned"
        return Verdict(REPEATED, t["tell"], t.get("value"), bool(t.get("bound")),
                       why=f"the values of {t['trial']} ({t['verdict']}, {figure}): not launched again; "
                           "the verification launches the best again beside the starter")
    return None


def outputs_check(compared: Optional[dict[str, Any]], may_differ: bool) -> dict[str, Any]:
    """A trial's greedy outputs against the starter's (workloads/outputs.compare_runs's result, None where none
    was compared), in the shape the recommendation reads (report/recommend.outputs_of)."""
    base = {"reference": "starter", "may_differ": may_differ}
    if compared is None:
        return {**base, "check": "not checked"}
    verdict = compared.get("verdict")
    check = verdict if verdict in ("identical", "differs") else "not comparable"
    return {**base, "check": check, "identical": int(compared.get("identical") or 0),
            "prompts": int(compared.get("prompts") or 0)}


def judge(cell: dict[str, Any], row: Optional[dict[str, Any]], outputs: Optional[dict[str, Any]],
          floor: Optional[dict[str, Any]] = None) -> Verdict:
    """A launched trial's verdict from its cell's record (campaign.json: state, reason), its capacity row under the
    tune's SLO (report/capacity.capacity_rows), its outputs check (outputs_check) and the floor its search was held
    to ({"value": good req/s per GPU, "trial": whose figure it was}; None where none was)."""
    state = cell.get("state")
    if state == "pending":
        return Verdict(INTERRUPTED, None, why=cell.get("reason") or "interrupted")
    # before the cell's state: a trial whose answers differ is stopped at its output check (campaign.reference_run),
    # and its cell ends failed with no capacity search; the changed answers are why, not the missing figure
    if outputs and outputs.get("check") == "differs" and not outputs.get("may_differ"):
        reason = str(cell.get("reason") or "")
        # stopped_by is the local record's; a Ray node's ending carries its reason alone (cluster/dispatch.py)
        stopped = cell.get("stopped_by") == "reference_run" or "(campaign.reference_run)" in reason
        then = ("stopped there, before its capacity search; " if stopped else "" if state == "done"
                else f"its cell then {state}: {reason or 'no reason recorded'}; ")
        return Verdict(OUTPUTS_DIFFER, PRUNED,
                       why=f"greedy outputs differ from the starter's ({outputs.get('identical')}/"
                           f"{outputs.get('prompts')} prompts identical); {then}"
                           "search.outputs_may_differ = true allows it")
    if state != "done":
        why = cell.get("reason") or "no reason recorded"
        return Verdict(FAILED, PRUNED, why=why if state == "failed" else f"{state}: {why}")
    if row is None:
        return Verdict(FAILED, PRUNED, why="its capacity search left no result under the tune's SLO")
    if not row.get("result"):
        return Verdict(GATE_FAILED, PRUNED, why=f"gate {row.get('gate')}: its figures are not a result")
    if row.get("capacity") is None:
        return Verdict(NO_CAPACITY, COMPLETE, 0.0, why="no load searched met the SLO")
    if row.get("ceiling_per_gpu") is not None:
        whose = f" ({floor['trial']}'s)" if floor and floor.get("trial") else ""
        held = f"{float(floor['value']):.3g}{whose}" if floor and floor.get("value") is not None else "its floor"
        return Verdict(BELOW_BEST, PRUNED, why=f"its capacity search stopped at its first failing load: no load could "
                                               f"carry more than {row['ceiling_per_gpu']:.3g} good req/s per GPU, "
                                               f"below the best so far, {held}; search.prune = false measures such "
                                               "a trial whole")
    good = row.get("goodput_per_gpu")
    bound = bool(row.get("bound"))
    why = ("a lower bound: " + "; ".join(row.get("steps") or []) + " would pin it down") if bound else None
    return Verdict(MEASURED, COMPLETE, float(good or 0.0), bound, why)


def ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trials' capacity rows (each with `outputs`) ranked by the recommendation rules, one entry per SLO
    (report/recommend.recommendations): recommended (which, by how much over the next), undecided (a bound below
    the leader could still exceed it, and the step that would decide), or none."""
    return recommendations(rows)


def best(trials: list[dict[str, Any]], slo: str) -> dict[str, Any]:
    """The best so far by the verdict rules, from tune.json's trials (each with `row` and `outputs`): the
    recommendation under the tune's SLO, or {"verdict": "none"} before any trial has a figure."""
    rows = []
    for t in trials:
        row = t.get("row")
        if row is None or row.get("slo") != slo:
            continue
        rows.append({**row, "variant": t["trial"], "outputs": t.get("outputs")})
    recs = [r for r in ranked(rows) if r["slo"] == slo]
    return recs[0] if recs else {"slo": slo, "verdict": "none", "best": None, "leading": None,
                                 "note": "no trial has a figure under this SLO yet", "left_out": []}


UNLAUNCHED = frozenset({BROKE_RULE, INVALID, NO_FIT, REPEATED})  # not launched: they cost no launch
# ...and so do not count against `trials`, up to this many in one tune: past it each counts, so a space whose rules
# refuse nearly everything still ends
FREE_UNLAUNCHED = 50


def counted(verdicts: list[Optional[str]]) -> int:
    """How many finished searched trials (their verdicts) count against `trials`: every launched one; one
    refused before its launch (a `require` rule, models.toml's rules, the planner) costs nothing and is not
    counted, up to FREE_UNLAUNCHED of them. Pure."""
    free = sum(v in UNLAUNCHED for v in verdicts)
    return len(verdicts) - min(free, FREE_UNLAUNCHED)


def trials_left(finished: int, budget: Optional[int], spent_s: float, wall_s: Optional[float]) -> bool:
    """Whether another searched trial starts: within `trials` (finished ones count, interrupted ones do not) and
    before `wall` is spent (a trial that started runs to its end: its cell_timeout bounds it)."""
    if budget is not None and finished >= budget:
        return False
    if wall_s is not None and spent_s >= wall_s:
        return False
    return True


def to_ask(finished: int, running: int, budget: Optional[int], parallel: int, spent_s: float,
           wall_s: Optional[float]) -> int:
    """How many searched trials to ask for now (`tune --ray`): the free lanes of `parallel`, no more than the
    trial budget has left once the running ones are counted (each will finish and count), none once `wall` is
    spent. Pure."""
    if wall_s is not None and spent_s >= wall_s:
        return 0
    n = parallel - running
    if budget is not None:
        n = min(n, budget - finished - running)
    return max(0, n)
