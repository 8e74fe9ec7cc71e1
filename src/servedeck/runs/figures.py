"""A measured point's figures, from its request records plus the few facts records cannot hold.

Used twice with the same code: when a point finishes (to write summary.json) and whenever a run
is shown (recomputed from requests.jsonl), so the two can never disagree.

Beyond loadgen.stats.summarize, a point gets:
  cache      the prefix-cache use the engine's own counters saw across the measured phase
             (vLLM prefix_cache_hits/queries, llama.cpp prompt_tokens_cached/processed), next to
             what the requests reported one by one
  agreement  llama.cpp only: servedeck's TTFT/TPOT against the engine's `timings` per request
  engine_agreement  engines with latency histograms on /metrics (vLLM): servedeck's TTFT/TPOT/E2E against
             the engine's own account of the same measured phase
and then its workload kind's own (`add_figures`: workloads/shape.py's `point_figures`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.stats import UNREPORTED_CACHE, Slo, dist, summarize, tpot


def slo_of(workload: dict[str, Any]) -> Optional[Slo]:
    s = workload.get("slo") or {}
    if not any(s.get(k) is not None for k in ("ttft_ms", "tpot_ms", "e2e_ms")):
        return None
    return Slo(ttft_ms=s.get("ttft_ms"), tpot_ms=s.get("tpot_ms"), e2e_ms=s.get("e2e_ms"))


def counter_delta(before: Optional[dict[str, float]], after: Optional[dict[str, float]]) -> dict[str, Any]:
    """Change of the engine's prefix-cache counters over the measured phase (tokens)."""
    if not before or not after or "queries" not in before or "queries" not in after:
        return {"available": False}
    q = after["queries"] - before["queries"]
    h = after.get("hits", 0.0) - before.get("hits", 0.0)
    return {"available": True, "queried_tokens": q, "hit_tokens": h, "fraction": (h / q) if q > 0 else None}


def agreement(records: Iterable[RequestRecord]) -> Optional[dict[str, Any]]:
    """servedeck vs llama.cpp's own account of each request (ms), for requests carrying `timings`.

    ttft_minus_prompt_ms   client TTFT − engine prompt_ms: HTTP, queueing and the first token's send
    tpot_minus_engine_ms   client TPOT − engine predicted_ms/(predicted_n − 1): same definition both sides
    tpot_ratio             client TPOT / engine per-token time
    e2e_minus_engine_ms    client E2E − (prompt_ms + predicted_ms)
    """
    d_ttft, d_tpot, r_tpot, d_e2e, prefill_client, prefill_engine = [], [], [], [], [], []
    for r in records:
        t = r.timings
        if r.kind != "measured" or r.status != "ok" or not isinstance(t, dict) or r.ttft is None:
            continue
        p_ms, g_ms, g_n, p_n = t.get("prompt_ms"), t.get("predicted_ms"), t.get("predicted_n"), t.get("prompt_n")
        if not isinstance(p_ms, (int, float)) or not isinstance(g_ms, (int, float)):
            continue
        d_ttft.append(r.ttft * 1000 - p_ms)
        if r.e2e is not None:
            d_e2e.append(r.e2e * 1000 - (p_ms + g_ms))
        client_tpot = tpot(r)
        if isinstance(g_n, int) and g_n >= 2 and client_tpot is not None:
            engine_tpot = g_ms / (g_n - 1)
            d_tpot.append(client_tpot * 1000 - engine_tpot)
            if engine_tpot > 0:
                r_tpot.append(client_tpot * 1000 / engine_tpot)
        if isinstance(p_n, int) and p_n > 0 and p_ms > 0:
            prefill_client.append(p_n / r.ttft)
            prefill_engine.append(p_n / (p_ms / 1000))
    if not d_ttft:
        return None
    ratio = [c / e for c, e in zip(prefill_client, prefill_engine) if e > 0]
    return {"requests": len(d_ttft), "ttft_minus_prompt_ms": dist(d_ttft), "tpot_minus_engine_ms": dist(d_tpot),
            "tpot_ratio": dist(r_tpot), "e2e_minus_engine_ms": dist(d_e2e),
            "prefill_tok_s_client": dist(prefill_client), "prefill_tok_s_engine": dist(prefill_engine),
            "prefill_ratio": dist(ratio)}


def _delta(before: Optional[dict[str, Any]], after: dict[str, Any]) -> Optional[dict[str, Any]]:
    """One histogram's change over a stretch: count, sum, cumulative buckets. None when the engine's
    counters went backwards (it restarted in between) or nothing was counted."""
    b = before or {"count": 0.0, "sum": 0.0, "buckets": []}
    was = {le: c for le, c in b.get("buckets") or []}
    count, total = after["count"] - b["count"], after["sum"] - b["sum"]
    buckets = [[le, c - was.get(le, 0.0)] for le, c in after["buckets"]]
    if count <= 0 or any(c < 0 for _, c in buckets):
        return None
    return {"count": count, "sum": total, "buckets": buckets}


def bucket_quantile(q: float, buckets: list[list[float]]) -> Optional[float]:
    """The q-quantile of cumulative [upper bound, count] buckets, interpolated linearly inside the bucket
    it falls in, as Prometheus's histogram_quantile does; the last finite bound when it falls in +Inf's."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * ((rank - below) / (c - below) if c > below else 1.0)
        lower, below = le, c
    return lower


def bucket_of(q: float, buckets: list[list[float]]) -> Optional[tuple[float, float]]:
    """The (lower, upper] bounds of the bucket the q-quantile falls in: all a histogram knows of it (the
    interpolated figure inside is a guess at where in the bucket it lies). Upper is +Inf past the last bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lower = q * buckets[-1][1], 0.0
    for le, c in buckets:
        if c >= rank:
            return lower, le
        lower = le
    return lower, float("inf")


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1000


def _binned(values: list[float], bounds: list[float]) -> list[list[float]]:
    """The client's values (seconds) counted into the engine's buckets, so a quantile compares at one resolution."""
    import numpy as np  # here, not at the top: every servedeck command imports this module (--help included)

    arr = np.sort(np.asarray(values, dtype=float))
    return [[le, float(np.searchsorted(arr, le, side="right"))] for le in bounds]


QUANTILES = (0.5, 0.9, 0.99)  # the engine's quantiles a point keeps, each with its bucket


def histogram_agreement(before: Optional[dict[str, Any]], after: Optional[dict[str, Any]],
                        records: Iterable[RequestRecord]) -> Optional[dict[str, Any]]:
    """servedeck against the engine's own latency histograms (`Engine.latency_histograms`, read from its
    /metrics before and after the measured phase): per figure the engine's count, mean (its sum / count:
    exact) and quantiles (interpolated inside its buckets, each with the bucket it lies in: `p50_bucket_ms`,
    all the histogram knows of it), the client's over the same requests, and the client's quantiles binned
    into the engine's buckets, so both sides are read at one resolution.

    The engine times from its own receipt of a request (vLLM: after the API server rendered and tokenized
    the prompt) to its first and last token; the client from the request's send to the first and last
    content bytes it read. `mean_minus_engine_ms` is what lies between: HTTP, the server's front end, the
    client. Counts that differ mean the two did not see the same requests (traffic from elsewhere)."""
    import numpy as np

    if before is None or not after:  # unreadable at one end: nothing to compare
        return None
    ok = [r for r in records if r.kind == "measured" and r.status == "ok"]
    first_tokens = sum(1 for r in records if r.kind == "measured" and r.ttft is not None)
    client: dict[str, list[float]] = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [t for t in (tpot(r) for r in ok) if t is not None],
        "e2e": [r.e2e for r in ok if r.e2e is not None],
    }
    rows: dict[str, Any] = {}
    for key, now in after.items():
        delta = _delta(before.get(key), now)
        if delta is None:
            continue
        bounds = [le for le, _ in delta["buckets"]]
        eng = {"name": now.get("name"), "requests": int(round(delta["count"])),
               "mean_ms": delta["sum"] / delta["count"] * 1000,  # exact: the histogram's sum over its count
               **{f"p{int(q * 100)}_ms": _ms(bucket_quantile(q, delta["buckets"])) for q in QUANTILES},
               # what the histogram knows of each quantile: its bucket (the figure above is interpolated in it)
               **{f"p{int(q * 100)}_bucket_ms": [x * 1000 for x in bucket_of(q, delta["buckets"]) or ()] or None
                  for q in QUANTILES}}
        row: dict[str, Any] = {"engine": eng}
        vals = client.get(key)
        if vals:
            binned = _binned(vals, bounds)
            row["client"] = {"requests": len(vals), "mean_ms": float(np.mean(vals)) * 1000,
                             "p50_ms": float(np.median(vals)) * 1000,
                             "p90_ms": float(np.percentile(vals, 90)) * 1000,
                             "p50_ms_binned": _ms(bucket_quantile(0.5, binned)),
                             "p50_bucket_ms_binned": [x * 1000 for x in bucket_of(0.5, binned) or ()] or None}
            row["mean_minus_engine_ms"] = row["client"]["mean_ms"] - eng["mean_ms"]
            row["mean_ratio"] = row["client"]["mean_ms"] / eng["mean_ms"] if eng["mean_ms"] > 0 else None
        rows[key] = row
    if not rows:
        return None
    ttft_n = (rows.get("ttft") or {}).get("engine", {}).get("requests")
    return {"source": "the engine's /metrics histograms, before and after the measured phase",
            "figures": rows, "client_first_tokens": first_tokens,
            "same_requests": ttft_n == first_tokens if ttft_n is not None else None}


def point_figures(records: list[RequestRecord], point: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """Figures of one point: `point` carries the load meta (client cpu/wall) and cache counters."""
    load = point.get("load") or {}
    fig = summarize(records, cpu_s=load.get("client_cpu_s"), wall_s=load.get("wall_s"), slo=slo_of(workload),
                    loop=load.get("loop"), procs=load.get("client_procs"), wait_s=load.get("client_wait_s"),
                    host=load.get("host"), shape=load.get("shape"))
    counters = point.get("counters") or {"available": False}
    fig["cache"]["counters"] = counters
    frac_counters = counters.get("fraction") if counters.get("available") else None
    # The engine's counters see every request (including any the server did not report per
    # request); the per-request figure is the fallback.
    fig["cached_fraction"] = frac_counters if frac_counters is not None else fig["cache"]["cached_fraction"]
    fig["cached_fraction_source"] = ("engine counters" if frac_counters is not None
                                     else "per-request usage" if fig["cache"]["cached_fraction"] is not None else None)
    unreported = fig["counts"]["ok"] - fig["cache"]["reported"]
    if frac_counters is not None and unreported:  # said with what stands in for it
        said = UNREPORTED_CACHE.format(n=unreported)
        fig["warnings"] = [w if w != said else said + "; the point's cached share comes from the engine's own "
                           "prefix-cache counters" for w in fig["warnings"]]
    if frac_counters is not None and frac_counters > 0.05 and not fig["cache"]["requests_over_threshold"]:
        fig["warnings"].append(f"the engine's counters say {frac_counters:.1%} of prompt tokens came from the "
                               "prefix cache during this point: TTFT and prefill figures are inflated")
    fig["agreement"] = agreement(records)
    hist = point.get("engine_histograms") or {}
    fig["engine_agreement"] = histogram_agreement(hist.get("before"), hist.get("after"), records)
    sc = point.get("spec_counters") or {}
    fig["speculation"] = spec_figures(sc.get("before"), sc.get("after"), records,
                                      point.get("speculation_configured"), point.get("spec_timing_fields") or {})
    if fig["speculation"] and point.get("spec_note"):
        fig["speculation"]["note"] = point["spec_note"]
    return fig


def add_figures(fig: dict[str, Any], extra: Optional[Callable[[list[RequestRecord]], tuple[dict[str, Any], dict[str, Any]]]],
                records: list[RequestRecord]) -> dict[str, Any]:
    """A point's figures with its kind's own (workloads/shape.py `point_figures`) added: its warnings after the
    point's; returns the kind's additions to the point's headline."""
    if extra is None:
        return {}
    more, head = extra(records)
    more = dict(more)
    fig["warnings"] = list(fig.get("warnings") or []) + list(more.pop("warnings", []))
    fig.update(more)
    return head


def headline(fig: dict[str, Any]) -> dict[str, Any]:
    """The few numbers a list shows for a point."""
    def p50(key: str) -> Optional[float]:
        d = fig.get(key) or {}
        return d.get("p50")

    return {"ok": (fig.get("counts") or {}).get("ok"), "errors": (fig.get("counts") or {}).get("error"),
            "ttft_p50_ms": p50("ttft_ms"), "tpot_p50_ms": p50("tpot_ms"), "output_tok_s": fig.get("output_tok_s"),
            "prefill_tok_s_p50": p50("prefill_tok_s"), "cached_fraction": fig.get("cached_fraction"),
            # GPU energy over the measured window (telemetry/figures.py), where the GPUs were sampled
            **({"j_per_output_token": j} if (j := ((fig.get("telemetry") or {}).get("gpu") or {})
                                                .get("j_per_output_token")) is not None else {})}




def spec_figures(before: Optional[dict[str, Any]], after: Optional[dict[str, Any]], records: Iterable[RequestRecord],
                 configured: Optional[dict[str, Any]], timing_fields: dict[str, str]) -> Optional[dict[str, Any]]:
    """Speculative decoding over a measured phase, from the engine's own account only.

    acceptance_rate         accepted draft tokens / drafted tokens
    mean_acceptance_length  1 + accepted / draft rounds (tokens a verifying step yields; vLLM's definition)
    tokens_per_step         generated tokens / (generated − accepted): every decoding step yields one
                            token of its own, accepted drafts come on top
    Counters (server-wide, read before and after) come first; llama.cpp's per-response `timings`
    (draft_n, draft_n_accepted, predicted_n) stand in when the counters are missing. A figure the
    engine gives no basis for is absent, with the reason in `absent`; nothing is estimated.
    None when the launch does not speculate and the engine counted no drafts.
    """
    fig: dict[str, Any] = {"configured": configured, "absent": {}}
    delta: dict[str, Any] = {}
    if before and after:
        for k, v in after.items():
            if k != "accepted_per_pos" and k in before:
                delta[k] = v - before[k]
        pp_b, pp_a = before.get("accepted_per_pos") or {}, after.get("accepted_per_pos") or {}
        if pp_a:
            delta["accepted_per_pos"] = {p: pp_a[p] - pp_b.get(p, 0.0) for p in sorted(pp_a, key=int)}
    drafted_t = accepted_t = generated_t = 0
    with_timings = 0
    dk, ak = timing_fields.get("draft_tokens"), timing_fields.get("accepted_tokens")
    for r in records:
        t = r.timings
        if r.kind != "measured" or r.status != "ok" or not isinstance(t, dict) or not dk or not ak:
            continue
        if isinstance(t.get(dk), int) and isinstance(t.get(ak), int):
            with_timings += 1
            drafted_t += t[dk]
            accepted_t += t[ak]
            generated_t += t.get("predicted_n") or r.output_tokens or 0
    if with_timings:
        fig["per_response"] = {"requests": with_timings, "draft_tokens": drafted_t, "accepted_tokens": accepted_t,
                               "generated_tokens": generated_t}
    if "draft_tokens" in delta and "accepted_tokens" in delta:
        fig["source"] = "engine counters (/metrics, server-wide, before/after the measured phase)"
        drafted, accepted = delta["draft_tokens"], delta["accepted_tokens"]
        drafts, generated = delta.get("drafts"), delta.get("generation_tokens")
        fig["counters"] = delta
    elif with_timings:
        fig["source"] = "per-response timings (the engine exports no speculation counters)"
        drafted, accepted, drafts, generated = drafted_t, accepted_t, None, generated_t
    else:
        if not configured:
            return None
        fig["source"] = None
        fig["absent"]["all"] = ("the launch speculates but the engine reported no speculation counters at /metrics "
                                "and no draft fields per response")
        return fig
    if not configured and not drafted:
        return None
    fig.update(draft_tokens=drafted, accepted_tokens=accepted, drafts=drafts, generated_tokens=generated)
    if drafted:
        fig["acceptance_rate"] = accepted / drafted
    else:
        fig["acceptance_rate"] = None
        fig["absent"]["acceptance_rate"] = "no tokens were drafted during the measured phase"
    if drafts:
        fig["mean_acceptance_length"] = 1 + accepted / drafts
    else:
        fig["mean_acceptance_length"] = None
        fig["absent"]["mean_acceptance_length"] = ("no draft rounds were counted" if drafts == 0 else
                                                   "the engine does not say how many draft rounds it ran")
    if generated and generated > accepted:
        fig["tokens_per_step"] = generated / (generated - accepted)
    else:
        fig["tokens_per_step"] = None
        fig["absent"]["tokens_per_step"] = "the engine did not say how many tokens it generated"
    per_pos = delta.get("accepted_per_pos")
    if per_pos and drafts:
        fig["acceptance_per_position"] = {p: v / drafts for p, v in per_pos.items()}
    return fig
