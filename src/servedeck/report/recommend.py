"""Which variant to run under an SLO, pure: the rules campaign.md, the report, `compare` and the model page's
"tried and refuted" share (report/capacity.py renders them; nothing is measured here).

- What decides is what a variant carries within the SLO per GPU: goodput (requests/s that met the SLO) at its
  capacity. Concurrency is the load that took, shown beside it, never the ranking key: a variant whose users
  each get a quarter of the speed "fits" more of them and carries less.
- A capacity is exact only when its search ended `found`. Any other ending (client-bound, capped, unstable
  above, step budget spent, a search cut short) is a lower bound: the variant carries at least that much.
  A bound above another's figure decides; a bound below it decides nothing (it could still exceed it), so
  the verdict is "undecided" and names the step that would decide (BOUND_STEPS).
- A variant whose greedy outputs differ from the campaign's `reference` variant's is not recommended unless
  its [[variants]] entry says `outputs_may_differ = true` (speculative decoding that changes answers is a
  different product, not a faster one).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional

from servedeck.report.stats import across_repeats

EXACT = "found"  # the one search verdict whose capacity is the boundary itself (workloads/search.py)
# a search verdict whose capacity is a lower bound → the step that would pin it down
BOUND_STEPS = {
    "client-bound": "more client processes (`client_procs`)",
    "capped": "a higher `max`",
    "unstable above": "repeats (campaign `repeats`)",
    "step budget spent": "a search with more steps",
    "searching": "a search that runs to its end (the campaign resumed)",
    "below floor": "a search without `stop_below` (this one stopped once no load could carry it)",
}


# what set a search's cap (workloads/capacity.py caps): past the engine's slots or what its KV cache holds at
# once more users only queue, so a search capped there found the most the launch runs at once, a figure
ENGINE_CAPS = ("the engine's", "the KV cache")


def bound_step(cap: dict[str, Any]) -> Optional[str]:
    """None where a search's capacity (a run view's `capacity`) is a figure; else the step that would turn
    this lower bound into one."""
    verdict = cap.get("verdict")
    if verdict == EXACT:
        return None
    if verdict == "capped" and str((cap.get("cap") or {}).get("reason") or "").startswith(ENGINE_CAPS):
        return None
    return BOUND_STEPS.get(str(verdict), f"a search that ends `found` (this one ended {verdict!r})")


# --- greedy outputs against the reference ---------------------------------------------------------

def outputs_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant of a campaign (campaign.json), its greedy outputs against the `reference` variant's:
    check "reference" | "identical" | "differs" | "not comparable" | "not checked", the identical prompts of
    the cells compared, and whether its entry allows differing outputs. {} when the campaign names no
    reference (no output check ran)."""
    ovr = doc.get("outputs_vs_reference") or {}
    ref = doc.get("reference") or ovr.get("reference")
    if not ref:
        return {}
    variant_of = {c.get("id"): c.get("variant") for c in doc.get("cells") or []}
    checks = ovr.get("cells") or {}
    out: dict[str, dict[str, Any]] = {}
    for name, entry in (doc.get("variants") or {}).items():
        may = bool((entry or {}).get("outputs_may_differ"))
        base = {"reference": ref, "may_differ": may}
        if name == ref:
            out[name] = {**base, "check": "reference"}
            continue
        mine = [r for cid, r in checks.items() if variant_of.get(cid) == name]
        verdicts = {r.get("verdict") for r in mine}
        check = ("not checked" if not mine else "differs" if "differs" in verdicts
                 else "identical" if verdicts == {"identical"} else "not comparable")
        which = [r for r in mine if r.get("verdict") == check] or mine
        out[name] = {**base, "check": check, "identical": sum(int(r.get("identical") or 0) for r in which),
                     "prompts": sum(int(r.get("prompts") or 0) for r in which)}
    return out


def outputs_bar(outputs: Optional[dict[str, Any]]) -> Optional[str]:
    """Why a variant's outputs keep it from being recommended, or None."""
    if not outputs or outputs.get("check") != "differs" or outputs.get("may_differ"):
        return None
    return (f"greedy outputs differ from {outputs['reference']}'s ({outputs['identical']}/{outputs['prompts']} "
            "prompts identical); `outputs_may_differ = true` on its [[variants]] entry allows it")


# --- the recommendation ---------------------------------------------------------------------------

def recommendations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per SLO (rows: report/capacity.py capacity_rows): among the variants whose capacity is a result (every
    launch's gate passed) and whose outputs may be served (outputs_bar), the one carrying the most good
    requests/s per GPU, by how much over the next (with its interval where both have repeats); or
    "undecided" where a lower bound below the leader's figure could still exceed it, naming the step that
    would decide. `left_out` names every variant set aside and why."""
    out = []
    for slo in sorted({r["slo"] for r in rows}):
        found = [r for r in rows if r["slo"] == slo and r["capacity_per_gpu"] is not None]
        found.sort(key=lambda r: -(r["goodput_per_gpu"] if r["goodput_per_gpu"] is not None else -math.inf))
        left_out, ranked = [], []
        for r in found:
            why = (f"gate {r['gate']}: not a result" if not r["result"] else outputs_bar(r.get("outputs"))
                   or ("no goodput recorded at its capacity" if r["goodput_per_gpu"] is None else None))
            if why:
                left_out.append({"variant": r["variant"], "goodput_per_gpu": r["goodput_per_gpu"],
                                 "capacity": r["capacity"], "bound": r["bound"], "find": r["find"], "why": why})
            else:
                ranked.append(r)
        head = {"slo": slo, "slo_text": found[0]["slo_text"] if found else None, "left_out": left_out}
        if not ranked:
            note = ("no variant's capacity is a result or may be served: see left out" if found
                    else "no variant meets this SLO at any load searched")
            out.append({**head, "verdict": "none", "best": None, "leading": None, "note": note})
            continue
        lead, rest = ranked[0], ranked[1:]
        figure = {k: lead[k] for k in ("variant", "find", "capacity", "bound", "goodput_per_gpu",
                                       "output_tok_s_per_gpu", "goodput_interval", "repeats")}
        # a lower bound at or below the leader's figure could still exceed it: nothing is decided by it, unless its
        # search stopped below its floor with a ceiling under the leader's figure (stop_below: it cannot reach it)
        open_ = [r for r in rest if r["bound"] and not below(r, lead["goodput_per_gpu"])]
        if open_:
            out.append({**head, **figure, "verdict": "undecided", "best": None, "leading": lead["variant"],
                        "undecided": [{"variant": r["variant"], "goodput_per_gpu": r["goodput_per_gpu"],
                                       "capacity": r["capacity"], "find": r["find"],
                                       "step": "; ".join(r["steps"]) or "-"} for r in open_]})
            continue
        runner = rest[0] if rest else None
        by = (lead["goodput_per_gpu"] / runner["goodput_per_gpu"] - 1) \
            if runner and runner["goodput_per_gpu"] else None
        out.append({**head, **figure, "verdict": "recommended", "best": lead["variant"], "leading": lead["variant"],
                    "next": runner["variant"] if runner else None,
                    "next_goodput_per_gpu": runner["goodput_per_gpu"] if runner else None, "by": by,
                    "by_interval": by_interval(lead, runner) if runner else None,
                    "no_interval": _no_interval(lead, runner)})
    return out


def below(row: dict[str, Any], figure: Optional[float]) -> bool:
    """Whether a row's bound is decided against `figure` anyway: its every search stopped below its floor
    (stop_below) with a ceiling, the most it could carry, under `figure`."""
    ceiling = row.get("ceiling_per_gpu")
    return ceiling is not None and figure is not None and ceiling < figure


def pair(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`compare A B` under one SLO (two capacity_rows rows): which carries more good requests/s per GPU.
    verdict "A" | "B" | "same" | "undecided" (the lower figure is a bound: it could still exceed the other;
    `open` names that side and `step` what would decide) | "no figure"; change is B's against A's, and
    qualifier says when that change is "at least " (B's figure is a bound) or "at most " (A's is)."""
    ga, gb = a.get("goodput_per_gpu"), b.get("goodput_per_gpu")
    if ga is None or gb is None:
        return {"verdict": "no figure", "change": None, "qualifier": "", "open": None, "step": None}
    change = gb / ga - 1 if ga else None
    qualifier = "at least " if b["bound"] and not a["bound"] else "at most " if a["bound"] and not b["bound"] else ""
    low = b if gb < ga else a if ga < gb else (b if b["bound"] else a if a["bound"] else None)
    high = a if low is b else b
    if low is not None and low["bound"] and not below(low, high["goodput_per_gpu"]):
        return {"verdict": "undecided", "change": change, "qualifier": qualifier,
                "open": "B" if low is b else "A", "step": "; ".join(low["steps"]) or "-"}
    verdict = "same" if ga == gb else "B" if gb > ga else "A"
    return {"verdict": verdict, "change": change, "qualifier": qualifier, "open": None, "step": None}


def by_interval(best: dict[str, Any], runner: dict[str, Any]) -> Optional[dict[str, float]]:
    """How much more `best` carries than `runner` in good requests/s per GPU (mean/mean − 1), with the 95 %
    interval of that change from both sides' repeats (Welch t, report/stats.py): None unless each side has
    2 or more. Repeats that all found the same figure on both sides have no spread: the interval is the
    change itself."""
    a, b = runner.get("goodputs_per_gpu") or [], best.get("goodputs_per_gpu") or []
    if len(a) < 2 or len(b) < 2 or not sum(a):
        return None
    if len(set(a)) == 1 and len(set(b)) == 1:
        change = (sum(b) / len(b)) / (sum(a) / len(a)) - 1
        return {"change": change, "lo": change, "hi": change, "spread": False}
    with warnings.catch_warnings():  # scipy warns of precision loss on a side whose repeats agree exactly
        warnings.simplefilter("ignore", RuntimeWarning)
        change, lo, hi = across_repeats(a, b)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return {"change": change, "lo": lo, "hi": hi, "spread": True}


def _no_interval(best: dict[str, Any], runner: Optional[dict[str, Any]]) -> Optional[str]:
    """Why the change has no interval from repeats, or None where it can have one."""
    if runner is None:
        return None
    few = [r["variant"] for r in (best, runner) if len(r.get("goodputs_per_gpu") or []) < 2]
    if not few:
        return None
    return ("one capacity found a variant" if len(few) == 2 else f"one capacity found for {few[0]}") + \
        " (campaign repeats = 2 or more gives one)"
