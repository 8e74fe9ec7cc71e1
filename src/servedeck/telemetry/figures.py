"""A point's telemetry figures, rebuilt from telemetry.jsonl and requests.jsonl alone (the same code
when the point finishes and whenever the run is shown).

Over the point's measured window (its t0 + measured_start … measured_end, the client's clock):
    energy_j             per GPU from NVML's energy counter, read off at the window's two edges
                         (linear between the samples around each edge); where a GPU gives no counter,
                         power integrated over the window (trapezoids), and `energy_source` says which
    j_per_output_token   energy / output tokens of the point's measured requests; j_per_request alike;
    output_tokens_per_j  its inverse (the Pareto's energy axis)
    power                mean and max of the samples in the window, and their share of the enforced limit
    engine               peak KV usage, the longest waiting queue, most running, preemptions in the window
    arrivals             each measured request's engine state at its arrival (the last sample at or before
                         its send): waiting, running, KV usage; TTFT grouped by the waiting queue it met
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import Any, Iterable, Optional

from servedeck.fsio import read_jsonl
from servedeck.loadgen.records import RequestRecord
from servedeck.telemetry.sampler import FILE


def read_lines(run: Path) -> dict[Any, list[dict[str, Any]]]:
    """telemetry.jsonl by point (a torn last line, from a crash, is left out by read_jsonl)."""
    out: dict[Any, list[dict[str, Any]]] = {}
    path = Path(run) / FILE
    if not path.exists():
        return out
    for ln in read_jsonl(path):
        out.setdefault(ln.get("point"), []).append(ln)
    return out


def window_of(point: dict[str, Any]) -> Optional[tuple[float, float]]:
    """The measured phase on the client's clock (absolute perf_counter seconds), or None."""
    load = point.get("load") or {}
    t0, a, b = load.get("t0_perf_counter"), load.get("measured_start"), load.get("measured_end")
    if t0 is None or a is None or b is None or b <= a:
        return None
    return t0 + a, t0 + b


def _at(ts: list[float], vs: list[float], t: float) -> float:
    """A counter's value at t, linear between the samples around it (held at the ends)."""
    import numpy as np  # here, not at the top: every servedeck command imports this module (--help included)

    return float(np.interp(t, ts, vs))


def _integral(ts: list[float], ps: list[float], a: float, b: float) -> float:
    """∫ power dt over [a, b], the samples' trapezoids, power linear between samples (held at the ends)."""
    import numpy as np

    inner = [(t, p) for t, p in zip(ts, ps) if a < t < b]
    xs = [a] + [t for t, _ in inner] + [b]
    ys = [_at(ts, ps, a)] + [p for _, p in inner] + [_at(ts, ps, b)]
    return float(np.trapezoid(ys, xs)) if hasattr(np, "trapezoid") else float(np.trapz(ys, xs))


def _status(lines: list[dict[str, Any]], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ln in lines:
        if ln.get("source") != source:
            continue
        if ln.get("kind") == "unavailable":
            out["unavailable"] = ln.get("reason")
        elif ln.get("kind") == "end":
            out.update({k: ln.get(k) for k in ("missed", "errors", "last_error", "cpu_s")})
        elif ln.get("kind") == "start":
            out["interval_s"] = ln.get("interval_s")
    return out


def gpu_figures(lines: list[dict[str, Any]], window: Optional[tuple[float, float]]) -> dict[str, Any]:
    import numpy as np

    fig = _status(lines, "gpu")
    samples = [ln for ln in lines if ln.get("source") == "gpu" and ln.get("kind") == "sample"]
    fig["samples"] = len(samples)
    fig["xid"] = [{"gpu": ln.get("gpu"), "xid": ln.get("xid"), "t": ln.get("t")}
                  for ln in lines if ln.get("source") == "gpu" and ln.get("kind") == "xid"]
    if not samples or window is None:
        return fig
    a, b = window
    per_gpu: list[dict[str, Any]] = []
    for g in sorted({ln["gpu"] for ln in samples}):
        mine = sorted((ln for ln in samples if ln["gpu"] == g), key=lambda ln: ln["t"])
        ts = [ln["t"] for ln in mine]
        one: dict[str, Any] = {"gpu": g, "covered": ts[0] <= a and ts[-1] >= b}
        counter = [(ln["t"], ln["energy_j"]) for ln in mine if ln.get("energy_j") is not None]
        power = [(ln["t"], ln["power_w"]) for ln in mine if ln.get("power_w") is not None]
        if len(counter) >= 2:
            ct, cv = [t for t, _ in counter], [v for _, v in counter]
            one.update(energy_j=_at(ct, cv, b) - _at(ct, cv, a), energy_source="energy counter")
        elif len(power) >= 2:
            pt, pv = [t for t, _ in power], [v for _, v in power]
            one.update(energy_j=_integral(pt, pv, a, b), energy_source="integrated power")
        inside = [ln for ln in mine if a <= ln["t"] <= b]
        pw = [ln["power_w"] for ln in inside if ln.get("power_w") is not None]
        limits = [ln["limit_w"] for ln in inside if ln.get("limit_w")]
        if pw:
            one.update(mean_power_w=float(np.mean(pw)), max_power_w=float(max(pw)))
        if limits:
            one["limit_w"] = float(max(limits))
            if pw:
                one.update(mean_share_of_limit=one["mean_power_w"] / one["limit_w"],
                           max_share_of_limit=one["max_power_w"] / one["limit_w"])
        mem = [ln["mem_used"] for ln in inside if ln.get("mem_used") is not None]
        if mem:
            one["max_mem_used"] = max(mem)
        util = [ln["sm_util_pct"] for ln in inside if ln.get("sm_util_pct") is not None]
        if util:
            one["mean_sm_util_pct"] = float(np.mean(util))
        clocks = [ln["sm_clock_mhz"] for ln in inside if ln.get("sm_clock_mhz") is not None]
        if clocks:
            one["min_sm_clock_mhz"] = min(clocks)
        throttle: dict[str, int] = {}
        for ln in inside:
            for r in ln.get("throttle") or []:
                throttle[r] = throttle.get(r, 0) + 1
        one["throttle_samples"] = throttle
        per_gpu.append(one)
    fig["gpus"] = per_gpu
    with_energy = [g for g in per_gpu if "energy_j" in g]
    if with_energy and len(with_energy) == len(per_gpu):
        fig["energy_j"] = sum(g["energy_j"] for g in per_gpu)
        kinds = sorted({g["energy_source"] for g in per_gpu})
        fig["energy_source"] = kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(kinds)
    if all("mean_power_w" in g for g in per_gpu):
        fig["mean_power_w"] = sum(g["mean_power_w"] for g in per_gpu)
        fig["max_power_w"] = max(g["max_power_w"] for g in per_gpu)
        shares = [g["max_share_of_limit"] for g in per_gpu if "max_share_of_limit" in g]
        if shares:
            fig["max_share_of_limit"] = max(shares)
            fig["mean_share_of_limit"] = float(np.mean([g["mean_share_of_limit"] for g in per_gpu
                                                        if "mean_share_of_limit" in g]))
    fig["window_covered"] = all(g["covered"] for g in per_gpu)
    return fig


def engine_figures(lines: list[dict[str, Any]], window: Optional[tuple[float, float]]) -> dict[str, Any]:
    fig = _status(lines, "engine")
    samples = [ln for ln in lines if ln.get("source") == "engine" and ln.get("kind") == "sample"]
    fig["samples"] = len(samples)
    absent = sorted({a for ln in samples for a in ln.get("absent") or []})
    if absent:
        fig["absent"] = absent
    if not samples:
        return fig
    inside = [ln for ln in samples if window is None or window[0] <= ln["t"] <= window[1]] or samples

    def peak(key: str) -> Optional[float]:
        vs = [ln[key] for ln in inside if ln.get(key) is not None]
        return max(vs) if vs else None

    fig.update(peak_kv_usage=peak("kv_usage"), max_waiting=peak("waiting"), max_running=peak("running"))
    for key in ("preemptions", "prefix_hits"):
        vs = [ln[key] for ln in sorted(inside, key=lambda ln: ln["t"]) if ln.get(key) is not None]
        fig[key] = (vs[-1] - vs[0]) if len(vs) >= 2 else None
    return fig


def arrivals(records: Iterable[RequestRecord], t0: Optional[float],
             lines: list[dict[str, Any]], interval_s: Optional[float]) -> list[dict[str, Any]]:
    """Each measured request beside the engine's last sample at or before its send (first replica's;
    none when that sample is older than two intervals: the state it shows is not the one met)."""
    samples = sorted((ln for ln in lines if ln.get("source") == "engine" and ln.get("kind") == "sample"
                      and ln.get("replica", 0) == 0), key=lambda ln: ln["t"])
    ts = [ln["t"] for ln in samples]
    stale = 2 * (interval_s or 1.0)
    out = []
    for r in records:
        if r.kind != "measured" or r.t_send is None or t0 is None:
            continue
        sent = t0 + r.t_send
        i = bisect_right(ts, sent) - 1
        row: dict[str, Any] = {"id": r.id, "t_send": r.t_send, "status": r.status,
                               "ttft_ms": None if r.ttft is None else r.ttft * 1000}
        if i >= 0 and sent - ts[i] <= stale:
            s = samples[i]
            row.update(waiting=s.get("waiting"), running=s.get("running"), kv_usage=s.get("kv_usage"),
                       sample_age_s=round(sent - ts[i], 6))
        out.append(row)
    return out


def ttft_by_waiting(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import numpy as np

    groups: dict[float, list[float]] = {}
    for row in rows:
        if row.get("waiting") is not None and row.get("ttft_ms") is not None:
            groups.setdefault(row["waiting"], []).append(row["ttft_ms"])
    return [{"waiting": w, "requests": len(v), "ttft_p50_ms": float(np.median(v))} for w, v in sorted(groups.items())]


def point_telemetry(lines: list[dict[str, Any]], point: dict[str, Any], records: list[RequestRecord]) -> dict[str, Any]:
    """The figures above for one point; {"sampled": False, ...} when telemetry.jsonl has nothing of it."""
    if not lines:
        return {"sampled": False, "reason": "telemetry.jsonl holds no line of this point"}
    window = window_of(point)
    measured = [r for r in records if r.kind == "measured"]
    out_tokens = sum(r.output_tokens or r.streamed_tokens or 0 for r in measured if r.status == "ok")
    eng, gpu = engine_figures(lines, window), energy_figures(lines, window, out_tokens,
                                                             sum(r.status == "ok" for r in measured))
    rows = arrivals(measured, (point.get("load") or {}).get("t0_perf_counter"), lines, eng.get("interval_s"))
    joined = [r for r in rows if r.get("waiting") is not None or r.get("kv_usage") is not None]
    return {"sampled": True, "window_s": None if window is None else window[1] - window[0],
            "engine": eng, "gpu": gpu,
            "arrivals": {"requests": len(rows), "joined": len(joined), "ttft_by_waiting": ttft_by_waiting(rows)}}


def energy_figures(lines: list[dict[str, Any]], window: Optional[tuple[float, float]], output_tokens: int,
                   requests: int) -> dict[str, Any]:
    """gpu_figures, with the energy set against the output tokens and requests finished in the window."""
    gpu = gpu_figures(lines, window)
    if gpu.get("energy_j") is not None:
        e = gpu["energy_j"]
        gpu["output_tokens"], gpu["requests"] = output_tokens, requests
        gpu["j_per_output_token"] = e / output_tokens if output_tokens else None
        gpu["j_per_request"] = e / requests if requests else None
        gpu["output_tokens_per_j"] = output_tokens / e if e > 0 else None
    return gpu


def span_telemetry(lines: list[dict[str, Any]], window: tuple[float, float], output_tokens: int,
                   requests: int) -> dict[str, Any]:
    """The figures of a stretch that is not a bench point (a ramp's conversation): no request join."""
    if not lines:
        return {"sampled": False, "reason": "telemetry.jsonl holds no line of this stretch"}
    return {"sampled": True, "window_s": window[1] - window[0], "engine": engine_figures(lines, window),
            "gpu": energy_figures(lines, window, output_tokens, requests)}


def of_point(run: Path, point: dict[str, Any], records: list[RequestRecord]) -> dict[str, Any]:
    return point_telemetry(read_lines(run).get(point.get("index")), point, records)


def timeline(lines: list[dict[str, Any]], point: dict[str, Any], records: list[RequestRecord]) -> dict[str, Any]:
    """Series for a point's timeline, seconds from the measured start: requests in flight (the client's
    load), KV usage and the engine's queue (its samples), power (summed over the GPUs per sample tick)."""
    load = point.get("load") or {}
    t0, ms = load.get("t0_perf_counter"), load.get("measured_start") or 0.0
    if t0 is None:
        return {}
    base = t0 + ms

    def rel(t: float) -> float:
        return round(t - base, 3)

    eng = sorted((ln for ln in lines if ln.get("source") == "engine" and ln.get("kind") == "sample"
                  and ln.get("replica", 0) == 0), key=lambda ln: ln["t"])
    gpu = sorted((ln for ln in lines if ln.get("source") == "gpu" and ln.get("kind") == "sample"),
                 key=lambda ln: ln["t"])
    power: dict[float, float] = {}
    ngpu = max(1, len({ln["gpu"] for ln in gpu}))
    for i, ln in enumerate(gpu):  # one tick reads every GPU in turn: group consecutive readings
        tick = gpu[i - i % ngpu]["t"]
        if ln.get("power_w") is not None:
            power[rel(tick)] = power.get(rel(tick), 0.0) + ln["power_w"]
    events = sorted([(r.t_send + t0 - base, 1) for r in records if r.kind == "measured" and r.t_send is not None]
                    + [(r.t_end + t0 - base, -1) for r in records if r.kind == "measured" and r.t_send is not None
                       and r.t_end is not None])
    load_t, load_n, n = [], [], 0
    for t, d in events:
        n += d
        load_t.append(round(t, 3))
        load_n.append(n)
    return {"load": {"t": load_t, "in_flight": load_n},
            "engine": {"t": [rel(ln["t"]) for ln in eng], "kv_usage": [ln.get("kv_usage") for ln in eng],
                       "waiting": [ln.get("waiting") for ln in eng], "running": [ln.get("running") for ln in eng]},
            "power": {"t": list(power), "watts": list(power.values())},
            "window_s": (load.get("measured_end") or ms) - ms}
