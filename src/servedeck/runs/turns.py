"""Figures of a multi-turn workload per turn index and overall, from the request records (pure).

Each record of the `conversations` workload says its conversation and turn (records.py). Per turn
index, over the conversations that reached it:

    requests, ok         turns sent, turns that finished
    prompt_tokens        p50 of what the server counted (the whole history so far)
    cached_tokens        p50 of what the engine reported served from its prefix cache
    cached_share         Σ cached / Σ prompt tokens over the ok turns that report both
    ttft_ms, tpot_ms     p50 and p99

"overall" is the same over every turn. Rebuilt by `runs.read.load` from requests.jsonl, so a view
never shows figures its records do not support.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.stats import dist, tpot


def _p(values: list[float], q: str) -> Optional[float]:
    return dist(values)[q] if values else None


def _figures(recs: list[RequestRecord]) -> dict[str, Any]:
    ok = [r for r in recs if r.status == "ok"]
    both = [r for r in ok if isinstance(r.prompt_tokens, int) and isinstance(r.cached_tokens, int)]
    prompt = sum(r.prompt_tokens or 0 for r in both)
    ttft = [r.ttft * 1000 for r in ok if r.ttft is not None]
    tp = [t * 1000 for t in (tpot(r) for r in ok) if t]
    return {"requests": len(recs), "ok": len(ok),
            "prompt_tokens_p50": _p([float(r.prompt_tokens) for r in ok if isinstance(r.prompt_tokens, int)], "p50"),
            "cached_tokens_p50": _p([float(r.cached_tokens or 0) for r in both], "p50"),
            "cached_share": (sum(r.cached_tokens or 0 for r in both) / prompt) if prompt else None,
            "ttft_ms_p50": _p(ttft, "p50"), "ttft_ms_p99": _p(ttft, "p99"),
            "tpot_ms_p50": _p(tp, "p50"), "tpot_ms_p99": _p(tp, "p99")}


def turn_figures(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """{"per_turn": [{"turn": 1, ...}, ...], "overall": {...}} over the measured records that carry a turn."""
    recs = [r for r in records if r.kind == "measured" and r.turn is not None]
    turns = sorted({r.turn for r in recs if r.turn is not None})
    return {"per_turn": [{"turn": t, **_figures([r for r in recs if r.turn == t])} for t in turns],
            "overall": _figures(recs)}


def place_figures(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """The shared-prefix workload's figures: {"first": ..., "rest": ..., "overall": ...} over the measured
    records that carry a group (first: the request that found its group's prefix cold; rest: the others)."""
    recs = [r for r in records if r.kind == "measured" and r.group is not None]
    return {"first": _figures([r for r in recs if r.in_group == 1]),
            "rest": _figures([r for r in recs if r.in_group != 1]), "overall": _figures(recs)}
