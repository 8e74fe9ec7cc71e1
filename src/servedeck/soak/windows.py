"""Pure figures of a soak from its request records: counts by status, latency per time window,
and the longest clean window (the longest stretch with no failed request and no fault)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable


def counts(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    recs = list(records)
    by_status = Counter(r.get("status") or "unknown" for r in recs)
    http = Counter(str(r.get("http_status")) for r in recs if r.get("http_status") is not None)
    errors = Counter((r.get("error") or "")[:80] for r in recs if r.get("status") == "error")
    return {"total": len(recs), **{k: by_status.get(k, 0) for k in ("ok", "error", "cancelled")},
            "http": dict(sorted(http.items())), "errors": dict(errors.most_common(10))}


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    import numpy as np  # here, not at the top: every servedeck command imports this module (--help included)

    a = np.asarray(xs)
    return {"p50": round(float(np.percentile(a, 50)), 4), "p90": round(float(np.percentile(a, 90)), 4),
            "p99": round(float(np.percentile(a, 99)), 4), "max": round(float(a.max()), 4)}


def windows(records: Iterable[dict[str, Any]], window_s: float, end_s: float) -> list[dict[str, Any]]:
    """E2E latency percentiles (ok requests) and counts, per window of `window_s` by send time."""
    n = max(1, math.ceil(end_s / window_s)) if end_s > 0 else 1
    buckets: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for r in records:
        t = r.get("t_send")
        if t is None:
            continue
        buckets[min(n - 1, max(0, int(t // window_s)))].append(r)
    out = []
    for i, rs in enumerate(buckets):
        e2e = [r["t_end"] - r["t_send"] for r in rs if r.get("status") == "ok" and r.get("t_end") is not None]
        out.append({"start_s": round(i * window_s, 3), "end_s": round(min(end_s, (i + 1) * window_s), 3),
                    "requests": len(rs), "ok": sum(r.get("status") == "ok" for r in rs),
                    "errors": sum(r.get("status") == "error" for r in rs),
                    "burst_requests": sum(bool(r.get("point")) for r in rs), "e2e_s": _pct(e2e)})
    return out


def longest_clean(bad_at: Iterable[float], end_s: float, start_s: float = 0.0) -> dict[str, float]:
    """The longest interval in [start_s, end_s] containing none of the `bad_at` times."""
    marks = sorted(t for t in bad_at if start_s <= t <= end_s)
    edges = [start_s, *marks, end_s]
    best = (0.0, start_s, start_s)
    for a, b in zip(edges, edges[1:]):
        if b - a > best[0]:
            best = (b - a, a, b)
    return {"seconds": round(best[0], 3), "from_s": round(best[1], 3), "to_s": round(best[2], 3)}
