"""The conversations workload's section of a run's summary: figures per turn index and overall
(runs/turns.py rebuilds them from requests.jsonl), and where each conversation stopped."""

from __future__ import annotations

from typing import Any, Optional


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def _share(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0%}"


def _tok(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def conversations_section(view: dict[str, Any]) -> list[str]:
    c = view.get("conversations")
    if not isinstance(c, dict):
        return []
    w = view.get("workload") or {}
    head = ["turn", "turns sent", "ok", "prompt tokens p50", "cached tokens p50", "cached share",
            "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms"]

    def row(label: str, f: dict[str, Any]) -> str:
        cells = [label, str(f.get("requests")), str(f.get("ok")), _tok(f.get("prompt_tokens_p50")),
                 _tok(f.get("cached_tokens_p50")), _share(f.get("cached_share")), _ms(f.get("ttft_ms_p50")),
                 _ms(f.get("ttft_ms_p99")), _ms(f.get("tpot_ms_p50"))]
        return "| " + " | ".join(cells) + " |"

    out = ["## Conversations: figures per turn", "",
           f"{w.get('users')} users at once, {w.get('turns')} turns each: {w.get('turn_tokens')} tokens of "
           f"{w.get('content')} a turn, {w.get('answer_tokens')} answer tokens, think time {w.get('think_time_s')} s, "
           + (f"a shared system prompt of {w.get('system_prompt_tokens')} tokens." if w.get("system_prompt_tokens")
              else "no system prompt."), ""]
    if w.get("cut_note"):
        out += [f"Said before the first request: {w['cut_note']}.", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    out += [row(str(f["turn"]), f) for f in c.get("per_turn") or []]
    out += [row("all", c.get("overall") or {}), "",
            "Prompt tokens: the whole history as the server counted it. Cached: what the engine reported served "
            "from its prefix cache (usage.prompt_tokens_details.cached_tokens, or llama.cpp's timings.cache_n); "
            "share = Σ cached / Σ prompt tokens. Lines: requests.jsonl (conversation, turn)."]
    stops: dict[str, int] = {}
    for cut in c.get("cutoffs") or []:
        stops[cut["reason"]] = stops.get(cut["reason"], 0) + 1
    if stops:
        out += ["", "Where the conversations stopped: " + "; ".join(f"{n} × {r}" for r, n in stops.items()) + "."]
    return out
