"""Figures from request records, computed, never re-measured. Definitions: docs/loadgen.md.

`summarize(records, ...)` returns a plain JSON-able dict. Latencies are in milliseconds,
rates per second. Every distribution carries the number of values behind it (`n`), and
`counts` says which records were left out and why.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any


from servedeck.loadgen.records import RequestRecord

if TYPE_CHECKING:
    import numpy as np
    from servedeck.loadgen.schedule import LoadResult

STATS_SCHEMA = 1


@dataclass(frozen=True)
class Slo:
    """A request is "good" when it succeeded and meets every bound given here."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass(frozen=True)
class Thresholds:
    # The client set the pace when schedule lag p99 exceeds both of these: an absolute bound,
    # and a share of the median E2E, because a closed loop at 256 streams spreads each wave of
    # sends over ~10 ms of client work, which matters for 100 ms requests and not for 2 s ones.
    lag_p99_ms: float = 5.0
    lag_e2e_fraction: float = 0.01
    cpu_fraction: float = 0.9  # client CPU time / wall at or above this: the client is saturated
    cached_fraction: float = 0.05  # cached/prompt tokens above this: a prefix-cache hit
    prefill_min_prompt_tokens: int = 1024  # below this TTFT is mostly not prefill


def dist(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """n, mean, p50, p90, p99, min, max (linear interpolation); None figures when n == 0."""
    import numpy as np  # here, not at the top: every servedeck command imports this module (--help included)

    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "n": int(a.size), "mean": float(a.mean()), "p50": float(p50), "p90": float(p90),
        "p99": float(p99), "min": float(a.min()), "max": float(a.max()),
    }


def output_tokens(r: RequestRecord) -> int:
    """The server's count when it gave one, else what the client counted from the stream."""
    return r.output_tokens if r.output_tokens is not None else r.streamed_tokens


def tpot(r: RequestRecord) -> float | None:
    """(e2e − ttft) / (output_tokens − 1), seconds; None below two tokens."""
    out = output_tokens(r)
    ttft, e2e = r.ttft, r.e2e
    if ttft is None or e2e is None or out < 2:
        return None
    return (e2e - ttft) / (out - 1)


def itl_values(r: RequestRecord) -> list[float]:
    """Per token after the first chunk: each chunk's gap, divided among the tokens it carried."""
    out: list[float] = []
    t, n = r.chunk_t, r.chunk_n
    for k in range(1, len(t)):
        if n[k] <= 0:
            continue
        gap = (t[k] - t[k - 1]) / n[k]
        out.extend([gap] * n[k])
    return out


def is_cached(r: RequestRecord, frac: float) -> bool | None:
    """Whether the prefix cache served more than `frac` of the prompt; None if unknown."""
    if r.cached_tokens is None or not r.prompt_tokens:
        return None
    return r.cached_tokens > frac * r.prompt_tokens


def summarize(
    records: Sequence[RequestRecord],
    *,
    cpu_s: float | None = None,
    wall_s: float | None = None,
    slo: Slo | None = None,
    thresholds: Thresholds = Thresholds(),
    loop: str | None = None,
    procs: Sequence[dict[str, Any]] | None = None,
    wait_s: float | None = None,
    host: dict[str, Any] | None = None,
    shape: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Figures over the measured, successful records. `cpu_s`/`wall_s`: the client's CPU and wall
    time over the measured phase (LoadResult.cpu_s / wall_s), for the self-check; `loop` the event
    loop it ran on; `procs` one entry per client process when it ran in several (LoadResult.procs),
    each judged on its own."""
    measured = [r for r in records if r.kind == "measured"]
    ok = [r for r in measured if r.status == "ok"]
    warnings: list[str] = []
    counts = {
        "records": len(records),
        "warmup": sum(r.kind == "warmup" for r in records),
        "measured": len(measured),
        "ok": len(ok),
        "error": sum(r.status == "error" for r in measured),
        "cancelled": sum(r.status == "cancelled" for r in measured),
        "ok_without_content": sum(r.t_first_token is None for r in ok),
    }
    if counts["error"]:
        first = next(r.error for r in measured if r.status == "error")
        warnings.append(f"{counts['error']} of {len(measured)} measured requests failed (first: {first})")

    sends = [r.t_send for r in measured if r.t_send is not None]
    ends = [r.t_end for r in measured if r.t_end is not None]
    window = (max(ends) - min(sends)) if sends and ends else 0.0

    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpots = [x for x in (tpot(r) for r in ok) if x is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    itl: list[float] = []
    for r in ok:
        itl.extend(itl_values(r))
    total_out = sum(output_tokens(r) for r in ok)

    result: dict[str, Any] = {
        "schema": STATS_SCHEMA,
        "counts": counts,
        "window_s": window,
        "ttft_ms": _ms(ttft),
        "tpot_ms": _ms(tpots),
        "itl_ms": _ms(itl),
        "e2e_ms": _ms(e2e),
        "per_user_tok_s": dist([1.0 / x for x in tpots if x > 0]),
        "output_tokens": total_out,
        "output_tok_s": total_out / window if window > 0 else None,
        "request_s": len(ok) / window if window > 0 else None,
        "prefill_tok_s": _prefill(ok, thresholds),
        "cache": _cache(ok, thresholds, warnings),
        "token_counts": _token_counts(ok, warnings),
        "goodput": _goodput(measured, slo, window) if slo is not None else None,
        "client": _client(measured, cpu_s, wall_s, _median(e2e), thresholds, warnings, loop, procs, wait_s, host),
        "steady_state": _steady(measured, shape, warnings),
        "warnings": warnings,
    }
    return result


def _ms(values_s: Sequence[float]) -> dict[str, Any]:
    return dist([v * 1000.0 for v in values_s])


def _prefill(ok: Sequence[RequestRecord], th: Thresholds) -> dict[str, Any]:
    rates: list[float] = []
    excluded_cached = excluded_short = 0
    for r in ok:
        if r.ttft is None or r.ttft <= 0 or r.prompt_tokens is None:
            continue
        if r.prompt_tokens < th.prefill_min_prompt_tokens:
            excluded_short += 1
            continue
        if is_cached(r, th.cached_fraction):
            excluded_cached += 1
            continue
        rates.append(r.prompt_tokens / r.ttft)
    d = dist(rates)
    d.update(excluded_cached=excluded_cached, excluded_short=excluded_short,
             min_prompt_tokens=th.prefill_min_prompt_tokens)
    return d


UNREPORTED_CACHE = "the server did not report cached tokens for {n} requests"


def _cache(ok: Sequence[RequestRecord], th: Thresholds, warnings: list[str]) -> dict[str, Any]:
    known = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    cached = sum(r.cached_tokens or 0 for r in known)
    prompt = sum(r.prompt_tokens or 0 for r in known)
    hits = sum(bool(is_cached(r, th.cached_fraction)) for r in known)
    if hits:
        warnings.append(
            f"{hits} of {len(known)} requests were served more than {th.cached_fraction:.0%} from the "
            f"prefix cache ({cached / prompt:.1%} of prompt tokens cached): their TTFT is not a prefill time"
        )
    if len(known) < len(ok):
        warnings.append(UNREPORTED_CACHE.format(n=len(ok) - len(known)))
    return {
        "reported": len(known),
        "cached_tokens": cached,
        "prompt_tokens": prompt,
        "cached_fraction": cached / prompt if prompt else None,
        "requests_over_threshold": hits,
        "threshold": th.cached_fraction,
    }


def _token_counts(ok: Sequence[RequestRecord], warnings: list[str]) -> dict[str, Any]:
    reported = [r for r in ok if r.output_tokens is not None]
    diffs = [r.output_tokens - r.streamed_tokens for r in reported]  # type: ignore[operator]
    mismatched = sum(d != 0 for d in diffs)
    per_chunk = all(r.chunk_n_from_server for r in ok) and bool(ok)
    if mismatched:
        warnings.append(
            f"client and server token counts disagree on {mismatched} of {len(reported)} requests "
            f"(server − client: min {min(diffs)}, max {max(diffs)}); TPOT uses the server's count"
            + ("" if per_chunk else ", ITL assumes one token per chunk and is per chunk there")
        )
    if len(reported) < len(ok):
        warnings.append(f"the server reported no output token count for {len(ok) - len(reported)} requests")
    return {
        "server_reported": len(reported),
        "mismatched": mismatched,
        "max_abs_diff": max((abs(d) for d in diffs), default=0),
        "itl_basis": "server per-chunk counts" if per_chunk else "one token per content chunk",
    }


def _goodput(measured: Sequence[RequestRecord], slo: Slo, window: float) -> dict[str, Any]:
    good = 0
    for r in measured:
        if r.status != "ok" or r.ttft is None:
            continue
        if slo.ttft_ms is not None and r.ttft * 1000 > slo.ttft_ms:
            continue
        if slo.tpot_ms is not None:
            t = tpot(r)
            if t is None or t * 1000 > slo.tpot_ms:
                continue
        if slo.e2e_ms is not None and (r.e2e is None or r.e2e * 1000 > slo.e2e_ms):
            continue
        good += 1
    return {
        "slo": asdict(slo),
        "good_requests": good,
        "fraction": good / len(measured) if measured else None,
        "request_s": good / window if window > 0 else None,
    }


def _median(e2e_s: Sequence[float]) -> float | None:
    return statistics.median(e2e_s) if len(e2e_s) else None


STEADY_WAVES = 3  # what --waves suggests, and the window (in request lifetimes) that counts as steady on its own


def steady_state(measured: Sequence[RequestRecord], concurrency: int) -> dict[str, Any]:
    """Whether a closed loop of `concurrency` streams reached a steady state: a whole wave's worth of requests
    (one a stream) sent after the first wave had finished, or a window of STEADY_WAVES request lifetimes (E2E
    p50). Before the first wave ends every stream started together: the engine saw one burst, its queue
    and TTFT are the burst's. `waves`: measured requests a stream."""
    sends = sorted(((r.t_target, r.t_send, r.t_end) for r in measured if r.t_send is not None),
                   key=lambda x: (x[0], x[1]))
    first = sends[:concurrency]
    first_ends = [end for _, _, end in first if end is not None]
    first_end = max(first_ends) if first and len(first_ends) == len(first) else None  # every one of them ended
    after = sum(1 for _, send, _ in sends if first_end is not None and send >= first_end)
    e2e = [r.e2e for r in measured if r.status == "ok" and r.e2e is not None]
    ends = [end for _, _, end in sends if end is not None]
    start = min((send for _, send, _ in sends), default=0.0)
    window = max(ends) - start if ends else 0.0
    life = statistics.median(e2e) if e2e else None
    lifetimes = window / life if life else None
    return {"concurrency": concurrency, "requests": len(sends), "waves": len(sends) / concurrency,
            "first_wave_end_s": None if first_end is None else first_end - start,
            "after_first_wave": after, "lifetimes": lifetimes, "e2e_p50_s": life,
            "reached": after >= concurrency or (lifetimes is not None and lifetimes >= STEADY_WAVES)}


def _steady(measured: Sequence[RequestRecord], shape: dict[str, Any] | None,
            warnings: list[str]) -> dict[str, Any] | None:
    if not shape or shape.get("type") != "closed" or not measured:
        return None
    c = int(shape["concurrency"])
    st = steady_state(measured, c)
    if st["reached"] or not st["requests"]:
        return st
    longer = f", or a --duration of at least {STEADY_WAVES * st['e2e_p50_s']:.0f} s ({STEADY_WAVES} request " \
             "lifetimes)" if st["e2e_p50_s"] else ""
    what = "measured a single burst" if st["waves"] < 2 else "reached no steady state"
    warnings.append(
        f"{what}: {st['requests']} requests over {c} streams ({st['waves']:.1f} a stream), {st['after_first_wave']} "
        f"sent after the first wave ended; its TTFT and queueing are the burst's, not a steady state's: ask for "
        f"--waves {STEADY_WAVES} ({STEADY_WAVES * c} requests){longer}")
    return st


def _client(
    measured: Sequence[RequestRecord], cpu_s: float | None, wall_s: float | None,
    e2e_p50_s: float | None, th: Thresholds, warnings: list[str],
    loop: str | None = None, procs: Sequence[dict[str, Any]] | None = None,
    wait_s: float | None = None, host: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The client's self-check (docs/loadgen.md): was it short of CPU (loadgen/pace.py), and was its schedule lag
    over the floor. Without an SLO a lag over the floor flags the point as before; against an SLO (slo.judge)
    a lag counts only where it can move what the SLO reads."""
    from servedeck.loadgen.pace import ProcUse, saturated, short_of_cpu

    lags_ms = [r.lag * 1000 for r in measured if r.lag is not None]
    lag = dist(lags_ms)
    limit_ms = max(th.lag_p99_ms, th.lag_e2e_fraction * (e2e_p50_s or 0.0) * 1000)
    over = [x for x in lags_ms if x > limit_ms]
    # Each client process runs on one core: the busiest one is what saturates, not the sum.
    uses = [ProcUse(p.get("index"), p.get("cpu_s"), p.get("wall_s"), p.get("wait_s")) for p in procs] if procs \
        else [ProcUse(None, cpu_s, wall_s, wait_s)]
    short = short_of_cpu(uses, fraction=th.cpu_fraction)
    full = saturated(uses, fraction=th.cpu_fraction)
    cpu_fraction = max((u.cpu_s / u.wall_s for u in uses if u.cpu_s is not None and u.wall_s), default=None)
    wait_fraction = max((u.wait_s / u.wall_s for u in uses if u.wait_s is not None and u.wall_s), default=None)
    lag_reasons = []
    # One late send alone never flags a point: below ~100 requests p99 is the slowest one, and a
    # client whose one wake-up came late while the engine held every core did not set the pace.
    # From 101 requests up, p99 over the limit means at least two are, so large points read as before.
    if lag["p99"] is not None and lag["p99"] > limit_ms and len(over) >= 2:
        whose = "" if short else (
            f" while the client had CPU to spare (busiest process {cpu_fraction:.0%} of a core"
            + (f", waiting for a core {wait_fraction:.0%} of its window" if wait_fraction is not None else "")
            + "): a host whose cores are busy, which more client processes do not cure"
            if cpu_fraction is not None else "")
        lag_reasons.append(f"schedule lag p99 {lag['p99']:.1f} ms > {limit_ms:.1f} ms "
                           f"({len(over)} of {len(lags_ms)} requests sent later than that){whose}")
    elif len(over) == 1:
        warnings.append(f"one of {len(lags_ms)} requests was sent {over[0]:.1f} ms late (limit {limit_ms:.1f} ms); "
                        "one late send alone does not make the point client-bound")
    # Without an SLO a point is flagged as before: a process near a full core, or a lag over the floor; `short`
    # (a process that also waited for cores, or never idled) says whose a lag is, and slo.judge weighs the lag.
    flagged = full or bool(lag_reasons)
    reasons = short + lag_reasons if flagged else []
    if short and not flagged:
        warnings.append("the client was short of CPU though its sends kept the schedule: " + "; ".join(short))
    if reasons:
        warnings.append("the client, not the server, may have set the pace: " + "; ".join(reasons))
    return {
        "lag_ms": lag,
        "lag_limit_ms": limit_ms,
        "lag_over_limit": len(over),
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "wait_s": wait_s,
        "cpu_fraction": cpu_fraction,  # of one core; with several processes, the busiest one's
        "wait_fraction": wait_fraction,  # of the window runnable but waiting for a core; the busiest one's
        "loop": loop,
        "processes": len(procs) if procs else 1,
        "per_process": list(procs) if procs else None,
        "host": host,
        "short": short,  # the client's own shortfall: more client processes are the cure
        "saturated": full,  # a process near a full core: its stamps are late whatever the lag says
        "lag_source": None if not lag_reasons else "client" if short else "host",
        "client_bound": bool(reasons),
        "reasons": reasons,
    }


def summarize_run(result: LoadResult, **kwargs: Any) -> dict[str, Any]:
    """`summarize` with the client CPU and wall time the run measured."""
    return summarize(result.records, cpu_s=result.cpu_s, wall_s=result.wall_s, loop=result.loop or None,
                     procs=result.procs, wait_s=result.wait_s, host=result.host, shape=result.shape, **kwargs)
