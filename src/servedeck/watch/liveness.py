"""Liveness after ready: health is not enough. A periodic tiny completion must be answered.

An engine can answer /health while answering no request (the seed's "0 tok/s for ten minutes").
When the probe gets no answer within `stall_after_s`, the engine's own progress counters
(`Engine.metrics`: prompt_tokens, generation_tokens, running, waiting) decide between
    slow    the counters moved while we waited: it is working, just not for us yet (saturated)
    stalled the counters did not move: nothing is being computed at all
The verdict is a pure function of two samples and the probe's outcome (`judge`), tested without
processes; `probe` does the I/O.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from servedeck.engines.base import LaunchSpec
from servedeck.engines.metrics import parse_prometheus, read_counters  # noqa: F401 (re-exported)
from servedeck.supervisor import ready as R

PROGRESS = ("prompt_tokens", "generation_tokens")  # counters that only grow when work is done
@dataclass
class ProbeResult:
    at: float  # epoch seconds when the probe began
    health_ok: bool
    health: str
    answered: bool
    latency_s: float | None
    error: str | None
    before: dict[str, float] | None
    after: dict[str, float] | None
    waited_s: float
    verdict: str = ""
    detail: str = ""
    moved: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def progress_made(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """How much each PROGRESS counter grew between two reads ({} when none grew or a read failed);
    `running` says requests are held, not served, so it is not one of them."""
    if before is None or after is None:
        return {}
    return {k: after[k] - before[k] for k in PROGRESS if k in before and k in after and after[k] > before[k]}


def judge(health_ok: bool, health: str, answered: bool, waited_s: float, before: dict[str, float] | None,
          after: dict[str, float] | None, error: str | None = None) -> tuple[str, str, dict[str, float]]:
    """(verdict, detail, counter deltas). verdict: live | unhealthy | slow | stalled."""
    if not health_ok:
        return "unhealthy", f"health check failed ({health})", {}
    if answered:
        return "live", "answered a 1-token completion", {}
    moved = progress_made(before, after)
    shown = ", ".join(f"{k}={after[k]:g}" for k in ("prompt_tokens", "generation_tokens", "running", "waiting")
                      if after and k in after)
    if moved:
        grew = ", ".join(f"{k} +{v:g}" for k, v in moved.items())
        return ("slow", f"no answer to a 1-token completion in {waited_s:.0f} s, but it is working: {grew} "
                        f"in that time ({shown})", moved)
    if after is None:
        why = "counters unavailable (/metrics unreadable), so slow cannot be told from stuck"
    else:
        why = f"progress counters did not move ({shown})"
    return ("stalled", f"answers health but not a 1-token completion for {waited_s:.0f} s; {why}"
                       + (f"; probe: {error}" if error else ""), moved)


def probe(spec: LaunchSpec, metrics: dict[str, str], stall_after_s: float) -> ProbeResult:
    """Health, then a 1-token completion with `stall_after_s` to answer; counters before and after."""
    t0, m0 = time.monotonic(), time.time()
    before = read_counters(spec.base_url, metrics)
    ok, health = R.health_ok(spec, timeout_s=min(5.0, stall_after_s))
    answered, latency, error = False, None, None
    if ok:
        try:
            R.completion_probe(spec, timeout_s=stall_after_s, max_tokens=1)
            answered, latency = True, round(time.monotonic() - t0, 3)
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"[:200]
            if isinstance(e, httpx.HTTPStatusError):  # an answer, just an error one: not a stall
                ok, health = False, f"completion answered HTTP {e.response.status_code}"
    waited = round(time.monotonic() - t0, 3)
    after = read_counters(spec.base_url, metrics) if ok and not answered else before
    verdict, detail, moved = judge(ok, health, answered, waited, before, after, error)
    return ProbeResult(m0, ok, health, answered, latency, error, before, after, waited, verdict, detail, moved)
