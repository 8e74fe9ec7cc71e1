"""Tried and refuted: the variants of this model its campaigns measured, judged against the campaign's
base variant with `compare`'s own statistics (report/compare.py), so "--parallel 1: TTFT 3× slower at two users"
appears without anyone writing it. A variant is refuted when it failed to boot or crashed, failed its
gate, gave greedy outputs that differ from the campaign's reference variant's (its entry not saying
`outputs_may_differ = true`), or lost on a figure by a margin the comparison calls distinguishable from noise
or on what it carries within an SLO (good requests/s per GPU, bounds compared as bounds: report/recommend.py;
an undecided capacity is said, not counted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from servedeck.errors import ServedeckError
from servedeck.page.stale import Basis, mark
from servedeck.report.recommend import outputs_bar, outputs_of

CRASHED, TIMED_OUT, GATE_FAILED, OUTPUTS_DIFFER, LOST, WON, LEVEL, NO_RESULT = (
    "crashed", "timed out", "failed its gate", "outputs differ", "lost", "won", "not distinguishable",
    "no comparison")
# a cell that ran past its cell_timeout did not finish what the base variant finished in the same budget; a
# variant whose greedy outputs differ from the reference's (its entry not allowing it) is not a drop-in
REFUTED = (CRASHED, TIMED_OUT, GATE_FAILED, OUTPUTS_DIFFER, LOST)


def worse(v: Any) -> bool:
    """A verdict (report/stats.Verdict) that says B is worse than A by a real margin."""
    if not v.distinguishable or v.change is None:
        return False
    lower_better = not (v.figure.startswith("output tok/s") or v.figure.startswith("accuracy"))
    return v.change > 0 if lower_better else v.change < 0


def better(v: Any) -> bool:
    return bool(v.distinguishable and v.change is not None and not worse(v))


def unit(figure: str) -> str:
    return "tok/s" if figure.startswith("output tok/s") else "J" if figure.startswith("J per") else "ms"


def figure_line(label: str, v: Any) -> str:
    """"c=1 TTFT p50: 412.0 ms against 3,913.8 ms — B is 850 % slower [...]": A is the base variant."""
    u = unit(v.figure)
    return f"{label} {v.figure}: {v.a:,.1f} {u} (base) against {v.b:,.1f} {u} — {v.text}"


def _basis(run: Any) -> Basis:
    view = run.view
    cfg = view.get("config") or {}
    b = cfg.get("build") or {}
    return Basis(build=cfg.get("build_name"), build_path=b.get("binary") or b.get("python") or b.get("image"),
                 engine_version=(view.get("versions") or {}).get("engine_version"),
                 context=view.get("configured_context"))


def _knobs(doc: dict[str, Any], variant: str) -> str:
    d = (doc.get("variants") or {}).get(variant) or {}
    knobs = d.get("knobs") or {}
    if knobs:
        return ", ".join(f"{k}={v}" for k, v in knobs.items())
    ov = d.get("overrides") or {}
    parts = [f"args.{k}={v}" for k, v in (ov.get("args") or {}).items()]
    parts += [f"env.{k}={v}" for k, v in (ov.get("env") or {}).items()]
    parts += [f"{k}={v}" for k, v in ov.items() if k not in ("args", "env")]
    return ", ".join(parts) or "(as the model)"


def judge_variant(doc: dict[str, Any], variant: str, runs: list[Any], base_runs: list[Any],
                  failures: list[Any]) -> dict[str, Any]:
    """One variant's verdict against the base variant's runs (or why there is none)."""
    from servedeck.report.compare import compare

    cells = [c for c in doc.get("cells") or [] if c.get("variant") == variant]
    broken = [c for c in cells if c.get("state") in ("failed", "timed-out")]
    reasons: list[str] = []
    verdict = NO_RESULT
    if broken:
        verdict = CRASHED if any(c.get("state") == "failed" for c in broken) else TIMED_OUT
        fails = {f.what: f for f in failures}
        for c in broken:
            f = fails.get(f"cell {c.get('id')}")
            reasons.append(f"cell {c.get('id')} {c.get('state')}: {c.get('reason') or '-'}"
                           + (f" ({c.get('signature')})" if c.get("signature") else "")
                           + (f"; cause: {f.cause}" if f and f.cause and f.cause != "-" else ""))
    gates = [r for r in runs if r.gate == "failed"]
    if gates and verdict == NO_RESULT:
        verdict = GATE_FAILED
    for r in gates:
        reasons.append(f"gate failed in {r.name}: {(r.view.get('gate') or {}).get('result', {}).get('found', '?')}"
                       f"/{(r.view.get('gate') or {}).get('result', {}).get('probes', '?')} found")
    bar = outputs_bar(outputs_of(doc).get(variant))  # the recommendation's rule (report/recommend.py)
    if bar:
        verdict = OUTPUTS_DIFFER if verdict == NO_RESULT else verdict
        reasons.append(bar)
    benches = [r for r in runs if r.kind == "bench" and r.view.get("status") == "ok"]
    base = [r for r in base_runs if r.kind == "bench" and r.view.get("status") == "ok"]
    lost: list[str] = []
    won: list[str] = []
    if benches and base:
        try:
            cmp = compare(base, benches)
        except (ServedeckError, ValueError, KeyError) as e:
            reasons.append(f"no comparison: {e}")
        else:
            for x in cmp.capacity:  # what each carries within an SLO, by the recommendation's rules
                line = f"capacity ({x['slo']}): {x['text'].split(' (searches: ')[0]}"
                (lost if x["verdict"] == "A" else won if x["verdict"] == "B" else reasons).append(line)
            for p in cmp.points:
                for v in p.verdicts:
                    if worse(v):
                        lost.append(figure_line(p.label, v))
                    elif better(v):
                        won.append(figure_line(p.label, v))
            if len(cmp.att.knobs) > 1:  # several knobs at once: the loss cannot be credited to one of them
                reasons.append(f"{len(cmp.att.knobs)} knobs differ from the base: {cmp.attribution}")
    if verdict == NO_RESULT:
        verdict = LOST if lost else WON if won else LEVEL if benches and base else NO_RESULT
        base_gates = sorted({r.gate for r in base_runs if r.kind == "bench"})
        if verdict != NO_RESULT and base_gates != ["passed"]:
            # a figure of a server whose gate failed (or never ran) is not a result: nor is a comparison with it
            reasons.append(f"the base variant's gate: {', '.join(base_gates) or 'not run'}; a comparison with it is "
                           "not a result")
            verdict = NO_RESULT
    return {"variant": variant, "knobs": _knobs(doc, variant), "verdict": verdict, "refuted": verdict in REFUTED,
            "lost": lost, "won": won, "reasons": reasons,
            "cells": [{"id": c.get("id"), "state": c.get("state"), "reason": c.get("reason")} for c in cells],
            "runs": [{"run": r.name, "path": str(r.path), "kind": r.kind, "gate": r.gate,
                      "engine_version": (r.view.get("versions") or {}).get("engine_version"),
                      "build": (r.view.get("config") or {}).get("build_name"), "at": r.view.get("created_at")}
                     for r in runs]}


def campaign_entry(folder: Path, now: Basis) -> dict[str, Any]:
    from servedeck.report.collect import from_campaign

    coll = from_campaign(folder)
    doc = coll.campaign or {}
    by_variant = coll.variants()
    base = coll.base_variant
    base_runs = by_variant.get(base or "", [])
    out = []
    for name in (doc.get("variants") or {}):
        if name == base:
            continue
        j = judge_variant(doc, name, by_variant.get(name, []), base_runs, coll.failures)
        runs = by_variant.get(name, [])
        j["stale"] = mark(_basis(runs[0]), now, launch=False) if runs else {"stale": False, "why": [], "unknown": []}
        out.append(j)
    base_gate = sorted({r.gate for r in base_runs})
    return {"folder": str(folder), "name": doc.get("name"), "file": doc.get("file"), "started": doc.get("started"),
            "base_variant": base, "base_knobs": _knobs(doc, base) if base else None, "base_gate": base_gate,
            "base_runs": [r.name for r in base_runs], "variants": out}


def tried(folders: list[Path], now: Basis) -> dict[str, Any]:
    campaigns: list[dict[str, Any]] = []
    unreadable: list[str] = []
    for f in folders:
        try:
            campaigns.append(campaign_entry(f, now))
        except (ServedeckError, OSError, ValueError) as e:
            unreadable.append(f"{f}: {getattr(e, 'message', None) or e}")
    campaigns.sort(key=lambda c: c["started"] or "", reverse=True)
    refuted = [{"campaign": c["name"], "folder": c["folder"], "base_variant": c["base_variant"], **v}
               for c in campaigns for v in c["variants"] if v["refuted"]]
    return {"refuted": refuted, "campaigns": campaigns, "unreadable": unreadable}


def one_line(r: dict[str, Any]) -> str:
    """A refuted variant in words, as the seed writes them."""
    head = f"{r['variant']} ({r['knobs']}): {r['verdict']}"
    detail: Optional[str] = (r["lost"] or r["reasons"] or [None])[0]
    return head + (f" — {detail}" if detail else "")
