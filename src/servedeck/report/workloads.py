"""Sections of a run's summary beyond its kind's: speculation (the engine's own account), identical output.

Pure functions from a run's view (runs.read.load) or a comparison dict to markdown.
"""

from __future__ import annotations

from typing import Any, Optional

from servedeck.mdtable import table as _t


def _n(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _p(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


def speculation_section(view: dict[str, Any]) -> list[str]:
    rows, notes = [], []
    for p in view.get("points") or []:
        s = (p.get("figures") or {}).get("speculation")
        if not s:
            continue
        conf = s.get("configured") or {}
        rows.append([p.get("label", "-"), str(conf.get("method", "-")), str(conf.get("draft_max", "-")),
                     _p(s.get("acceptance_rate")), _n(s.get("mean_acceptance_length"), 2),
                     _n(s.get("tokens_per_step"), 2), _n(s.get("draft_tokens"), 0), _n(s.get("accepted_tokens"), 0),
                     _n(((p.get("figures") or {}).get("tpot_ms") or {}).get("p50"), 1)])
        for fig, why in (s.get("absent") or {}).items():
            notes.append(f"{p.get('label')}: {fig} absent: {why}")
        if s.get("source"):
            notes.append(f"{p.get('label')}: source {s['source']}")
        if s.get("note"):
            notes.append(f"{p.get('label')}: {s['note']}")
    if not rows:
        return []
    return ["## Speculative decoding (the engine's own account)", "",
            _t(["point", "method", "draft max", "acceptance", "mean acceptance length", "tokens/step",
                "drafted", "accepted", "TPOT p50 ms"], rows), ""] + [f"- {n}" for n in notes]


def outputs_section(view: dict[str, Any]) -> list[str]:
    o = view.get("outputs")
    if not o:
        return []
    return ["## Output check", "",
            f"{o.get('prompts', '-')} fixed prompts (seed {o.get('seed')}, temperature 0, {o.get('max_tokens')} "
            f"tokens) answered into {o.get('file')}, compared by {o.get('unit')}; {o.get('errors', 0)} failed. "
            "Compare with another launch: `servedeck compare-outputs THIS OTHER`."]


def outputs_markdown(result: dict[str, Any]) -> str:
    head = (f"**{result['verdict'].upper()}**: {result.get('identical')} of {result.get('prompts')} greedy answers "
            f"identical ({result.get('a')} vs {result.get('b')})")
    rows = []
    for r in result.get("rows") or []:
        if r["verdict"] == "differs":
            what = f"first differs at {r.get('unit')} {r.get('position')}: A {str(r.get('a'))!r} / B {str(r.get('b'))!r}"
        elif r["verdict"] == "identical":
            what = f"identical ({r.get('length')} {r.get('unit')}s)"
        else:
            what = r.get("why", "")
        rows.append([str(r.get("index")), str(r.get("content", "-")), r["verdict"], what])
    return head + "\n\n" + _t(["prompt", "content", "verdict", "detail"], rows) + "\n"
