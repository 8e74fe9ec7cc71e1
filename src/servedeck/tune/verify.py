"""Verification of the best few, pure: which trials are launched again, what each launch's figure is, and the
verdict over the repeats (nothing launched or measured here; runner.py runs the verification campaign).

After the search, the best `top` trials and the starter (the baseline) are launched again as one campaign with
`repeats` repeats, interleaved (starter#1, t4#1, t2#1, starter#2, ...: campaign/cells.py orders repeats round-robin),
so drift over the minutes it takes hits each alike. Each launch is gated and its greedy outputs held against the
starter's, as in the search.

The rule (docs/tune.md) pairs the launches by round (the candidate's launch r against the starter's launch r,
minutes apart), as `compare` pairs requests: drift between rounds hits both sides of a pair alike, so the
round-by-round differences are steadier than either side's figures. From 3 rounds a candidate **holds** when the
paired t interval (95 %, scipy) of its mean lead over the starter lies above 0 and that lead clears the noise
threshold `compare` uses (report/stats.NOISE, 2 % of the starter's median): the interval narrows as rounds are
added, so more repeats make a real lead easier to show and a lucky one no easier. With 2 rounds there is no
interval; the candidate must then lead in both rounds and its median beat the starter's by more than the spread,
the larger of the two sides' ranges (max − min):

    median(candidate) − median(starter) > max(range(candidate), range(starter))

(The range rule once applied from 3 rounds too; a range only widens as repeats are added, so a lead that every
added round confirmed grew harder to hold. tests/tune/test_verify.py simulates both properties.)

Among those that hold, the one with the highest median wins. A figure is good requests/s per GPU within the SLO at
the launch's capacity; no load meeting the SLO is 0. Where a starter's figure is a lower bound (its capacity search
did not end `found`), its true figure could be higher than any margin shows: the verdict is undecided, naming the
step that would pin it down.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from servedeck.report.stats import NOISE

STARTER = "starter"
VERIFIED, NOT_HELD, UNDECIDED, NO_BASELINE, NONE = "verified", "not held", "undecided", "no baseline", "nothing to verify"
# each candidate's outcome
HOLDS, WITHIN, BELOW, DIFFERS, TOO_FEW = "holds", "within the spread", "below the starter", "outputs differ", "too few"
PAIRED = 3  # rounds from which the paired t interval decides (2 have one degree of freedom: no usable interval)


def candidates(trials: list[dict[str, Any]], top: int) -> list[str]:
    """The best `top` searched trials by their search figure: measured (gate passed, outputs may be served), above 0.
    The starter is the baseline, never a candidate; ties keep trial order."""
    measured = [t for t in trials if t["trial"] != STARTER and t.get("verdict") == "measured"
                and (t.get("value") or 0) > 0]
    measured.sort(key=lambda t: -float(t["value"]))
    return [t["trial"] for t in measured[:top]]


def figure(cell: dict[str, Any], row: Optional[dict[str, Any]]) -> dict[str, Any]:
    """One launch of the verification: its cell (campaign.json: id, repeat, state, reason, runs) and its capacity row
    under the tune's SLO (report/capacity.capacity_rows over that launch's run alone, None where none)."""
    out: dict[str, Any] = {"cell": cell.get("id"), "repeat": cell.get("repeat"), "state": cell.get("state"),
                           "runs": list(cell.get("runs") or []), "value": None, "bound": False, "steps": [],
                           "gate": None, "why": None}
    if cell.get("state") != "done":
        return {**out, "why": cell.get("reason") or f"cell {cell.get('state')}"}
    if row is None:
        return {**out, "why": "its capacity search left no result under the tune's SLO"}
    out.update(gate=row.get("gate"), bound=bool(row.get("bound")), steps=list(row.get("steps") or []))
    if not row.get("result"):
        return {**out, "why": f"gate {row.get('gate')}: not a result"}
    good = row.get("goodput_per_gpu")
    return {**out, "value": 0.0 if row.get("capacity") is None or good is None else float(good)}


def _in_rounds(figs: list[dict[str, Any]]) -> list[Optional[float]]:
    """Each launch's figure in round order (its `repeat`; the list's order where repeats tie)."""
    ordered = sorted(enumerate(figs), key=lambda p: (p[1].get("repeat") or 0, p[0]))
    return [f.get("value") for _, f in ordered]


def paired_rounds(base: list[dict[str, Any]], cand: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidate against the starter round by round: each round's difference (candidate − starter) where both
    have a figure, how many rounds it won, their mean, and with 3 or more pairs the paired t interval (95 %, scipy)
    of the mean difference. `holds` when, with 3 or more pairs, the interval lies above 0; with fewer, when it won
    every round (outcome() then asks the range rule too)."""
    diffs = [c - b for b, c in zip(_in_rounds(base), _in_rounds(cand)) if b is not None and c is not None]
    out: dict[str, Any] = {"diffs": diffs, "won": sum(d > 0 for d in diffs), "pairs": len(diffs),
                           "mean": statistics.fmean(diffs) if diffs else None, "low": None, "high": None}
    if len(diffs) >= PAIRED:
        mean = out["mean"]
        if statistics.stdev(diffs) <= 1e-9 * max(abs(mean), 1.0):  # the same lead every round: the interval is
            out.update(low=mean, high=mean)                          # the point (scipy would lose it to rounding)
        else:
            from scipy import stats as st

            ci = st.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
            out.update(low=float(ci.low), high=float(ci.high))
    out["holds"] = bool(diffs) and (out["low"] > 0 if out["low"] is not None else out["won"] == len(diffs))
    return out


def _summary(figs: list[dict[str, Any]]) -> dict[str, Any]:
    vals = [f["value"] for f in figs if f["value"] is not None]
    return {"values": vals, "median": statistics.median(vals) if vals else None,
            "spread": (max(vals) - min(vals)) if vals else None,
            "bound": any(f["bound"] for f in figs if f["value"] is not None),
            "steps": list(dict.fromkeys(s for f in figs for s in f["steps"]))}


def outcome(base: dict[str, Any], cand: dict[str, Any], outputs: Optional[dict[str, Any]],
            rounds: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One candidate against the starter (each a _summary; `rounds` their paired_rounds): HOLDS, WITHIN (ahead, but
    from 3 rounds its paired interval reaches 0 or its lead is within the noise threshold; with 2, within the spread
    or not in both rounds), BELOW, DIFFERS or TOO_FEW, with the margin (median − the starter's median), the spread,
    the rounds, and why in words."""
    if outputs and outputs.get("check") == "differs" and not outputs.get("may_differ"):
        return {"outcome": DIFFERS, "margin": None, "spread": None,
                "why": f"greedy outputs differ from the starter's in the verification ({outputs.get('identical')}/"
                       f"{outputs.get('prompts')} prompts identical)"}
    if len(cand["values"]) < 2 or len(base["values"]) < 2:
        short = "it" if len(cand["values"]) < 2 else "the starter"
        return {"outcome": TOO_FEW, "margin": None, "spread": None,
                "why": f"{short} has {min(len(cand['values']), len(base['values']))} figure(s) that are results; "
                       "a spread needs 2 or more"}
    margin = cand["median"] - base["median"]
    spread = max(cand["spread"], base["spread"])
    words = f"median {cand['median']:.3g} against the starter's {base['median']:.3g}: {margin:+.3g}, spread {spread:.3g}"
    r = rounds or {}
    if r.get("pairs"):
        words += f"; ahead in {r['won']} of {r['pairs']} rounds"
        if r.get("low") is not None:
            words += f", paired lead {r['low']:+.3g}..{r['high']:+.3g} (95 %)"
    out = {"margin": margin, "spread": spread, "rounds": r or None}
    if margin <= 0:
        return {"outcome": BELOW, **out, "why": words}
    if r.get("low") is not None:  # 3 or more rounds: the paired interval decides
        small = base["median"] > 0 and r["mean"] < NOISE * base["median"]
        if r["holds"] and not small:
            return {"outcome": HOLDS, **out, "why": words + ": the paired lead holds"}
        lost = ("the paired interval reaches 0" if not r["holds"] else
                f"a mean lead of {r['mean']:+.3g} is within the {NOISE:.0%} noise threshold of the starter's median")
        return {"outcome": WITHIN, **out, "why": words + f": {lost}"}
    if margin > spread and (not r or r.get("holds")):
        return {"outcome": HOLDS, **out, "why": words + ": the margin holds over the spread"}
    lost = ("it did not lead in every round" if margin > spread
            else "the lead is within the spread (2 rounds: no paired interval)" if r.get("pairs")
            else "the lead is within the spread")
    return {"outcome": WITHIN, **out, "why": words + f": {lost}"}


def verdict(figs: dict[str, list[dict[str, Any]]], outputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The verification's verdict from each variant's launches (figure()) and its outputs check
    (report/recommend.outputs_of over the verification campaign): VERIFIED (`winner` is the trial whose margin
    holds, the highest median among those that do), NOT_HELD (no candidate's margin held: the starter stays),
    UNDECIDED (a candidate's margin held but the starter's figures are lower bounds), NO_BASELINE (the starter has
    fewer than 2 figures), NONE (no candidate). `trials` has each variant's summary and outcome."""
    names = [n for n in figs if n != STARTER]
    if not names:
        return {"verdict": NONE, "winner": None, "trials": {},
                "why": "no searched trial was measured above 0: nothing to verify against the starter"}
    base = _summary(figs.get(STARTER) or [])
    rows: dict[str, dict[str, Any]] = {STARTER: {**base, "outcome": "baseline"}}
    for n in names:
        s = _summary(figs[n])
        rows[n] = {**s, **outcome(base, s, outputs.get(n), paired_rounds(figs.get(STARTER) or [], figs[n]))}
    if len(base["values"]) < 2:
        return {"verdict": NO_BASELINE, "winner": None, "trials": rows,
                "why": f"the starter has {len(base['values'])} figure(s) that are results; a spread needs 2 or more "
                       "(see each launch's why)"}
    held = sorted((n for n in names if rows[n]["outcome"] == HOLDS), key=lambda n: -rows[n]["median"])
    if held and base["bound"]:
        return {"verdict": UNDECIDED, "winner": None, "leading": held[0], "trials": rows,
                "why": f"{held[0]}'s margin holds, but the starter's figures are lower bounds: it could carry more; "
                       f"{'; '.join(base['steps']) or 'a search that ends found'} would decide"}
    if held:
        w = rows[held[0]]
        return {"verdict": VERIFIED, "winner": held[0], "trials": rows,
                "why": f"{held[0]}: {w['why']} ({len(w['values'])} figures against the starter's "
                       f"{len(base['values'])}, launches interleaved)"}
    return {"verdict": NOT_HELD, "winner": None, "trials": rows,
            "why": "no candidate's margin over the starter held: " + "; ".join(f"{n}: {rows[n]['why']}" for n in names)}
