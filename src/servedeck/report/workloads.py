"""Sections for the workloads beyond plain load points: the ramp, speculation, identical output.

Pure functions from a run's view (runs.read.load) or a comparison dict to markdown.
"""

from __future__ import annotations

from typing import Any, Optional


def _t(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", "⏎") for c in row) + " |" for row in rows]
    return "\n".join(out)


def _n(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _p(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


def ramp_section(view: dict[str, Any]) -> list[str]:
    r = view.get("ramp")
    if not r:
        return []
    cut = r.get("cutoff") or {}
    out = ["## Ramp: one conversation grown turn by turn", "",
           f"Stopped after turn {cut.get('turn', '-')}: {cut.get('reason') or 'still running'}. "
           f"Needle (code planted in turn 1): found {r.get('needle_found', 0)} of {r.get('needle_checks', 0)} checks. "
           f"Largest context {r.get('max_context_tokens', '-')} tokens of {r.get('limit', '-')}.", ""]
    rows = []
    for ln in r.get("turns") or []:
        needle = ln.get("needle")
        rows.append([str(ln.get("turn")), ln.get("status", "-"), str(ln.get("context_tokens") or "-"),
                     _n(ln.get("ttft_s"), 2), _n(ln.get("prefill_tok_s"), 0), _n(ln.get("decode_tok_s")),
                     _p(ln.get("cached_share")),
                     "-" if not needle else ("found" if needle.get("found") else "MISSED")])
    if rows:
        out += [_t(["turn", "status", "context tokens", "TTFT s", "prefill tok/s (new part)", "decode tok/s",
                    "cached", "needle"], rows), "",
                "Context: prompt tokens by the server's count. Prefill: tokens not served from the prefix cache / "
                "TTFT. Decode: (answer tokens − 1) / (end − first token). Cached: the engine's own count "
                "(usage, timings or its counters). Lines: ramp.jsonl."]
    notes = [ln["cache_note"] for ln in r.get("turns") or [] if ln.get("cache_note")]
    if notes:
        out += ["", f"**Prefix cache**: {len(notes)} turn(s) did not reuse the conversation prefix ({notes[0]})."]
    return out


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
