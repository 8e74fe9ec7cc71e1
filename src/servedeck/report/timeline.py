"""The report's timeline per point: what the client sent and what the engine and the GPUs did meanwhile,
on one clock (seconds from the point's measured start; warm-up before zero). Four lanes, one figure:

    load       requests in flight (the client's records)
    KV cache   the engine's KV-cache usage (its /metrics; absent where the engine exports none)
    queue      the engine's waiting and running requests
    power      the GPUs' draw (NVML; summed over the launch's GPUs) and the enforced limit

Every series comes from the run folder's telemetry.jsonl and requests.jsonl (telemetry/figures.py's
`timeline`); a lane with nothing sampled says why, from the sampler's own `unavailable` line.
"""

from __future__ import annotations

from typing import Any, Optional

from servedeck.fsio import read_jsonl
from servedeck.loadgen.records import RequestRecord
from servedeck.report.blocks import Block, Figure, Link, Para, Section, Table
from servedeck.report.collect import Collection, Run
from servedeck.report.render import ms, num
from servedeck.telemetry.figures import read_lines, timeline

MAX_FIGURES = 12  # a campaign of many variants × points: the first repeat of each, up to this many


def _records(run: Run) -> dict[Any, list[RequestRecord]]:
    out: dict[Any, list[RequestRecord]] = {}
    for ln in read_jsonl(run.path / "requests.jsonl"):
        idx = ln.pop("point", 0)
        try:
            out.setdefault(idx, []).append(RequestRecord.from_json(ln))
        except (TypeError, ValueError):
            continue  # runs/read.py counts and names unreadable lines; the timeline just leaves them out
    return out


def _why(lines: list[dict[str, Any]], source: str) -> Optional[str]:
    return next((ln.get("reason") for ln in lines if ln.get("source") == source and ln.get("kind") == "unavailable"),
                None)


def timeline_svg(series: dict[str, Any], lines: list[dict[str, Any]], title: str, salt: str) -> str:
    from servedeck.report.plots import _svg, plt

    fig, axes = plt.subplots(4, 1, figsize=(8, 6.4), sharex=True)
    window = series.get("window_s") or 0.0
    for ax in axes:
        ax.axvspan(0, window, color="0.92", zorder=0)
        ax.grid(alpha=0.3)
    load, eng, power = series.get("load") or {}, series.get("engine") or {}, series.get("power") or {}
    axes[0].step(load.get("t") or [], load.get("in_flight") or [], where="post", color="C0")
    axes[0].set_ylabel("in flight")
    kv = [(t, v) for t, v in zip(eng.get("t") or [], eng.get("kv_usage") or []) if v is not None]
    if kv:
        axes[1].plot([t for t, _ in kv], [v * 100 for _, v in kv], "-", color="C1")
        axes[1].set_ylim(0, 100)
    else:
        axes[1].text(0.5, 0.5, "no KV-usage series: " + (_why(lines, "engine") or "the engine exports none"),
                     ha="center", va="center", transform=axes[1].transAxes, fontsize=7)
    axes[1].set_ylabel("KV cache %")
    for key, colour in (("waiting", "C3"), ("running", "C2")):
        pts = [(t, v) for t, v in zip(eng.get("t") or [], eng.get(key) or []) if v is not None]
        if pts:
            axes[2].step([t for t, _ in pts], [v for _, v in pts], where="post", color=colour, label=key)
    if eng.get("t"):
        axes[2].legend(fontsize=6, loc="upper right")
    else:
        axes[2].text(0.5, 0.5, "engine not sampled: " + (_why(lines, "engine") or "no samples"), ha="center",
                     va="center", transform=axes[2].transAxes, fontsize=7)
    axes[2].set_ylabel("engine queue")
    if power.get("t"):
        axes[3].plot(power["t"], power["watts"], "-", color="C4", label="power")
        limits = [ln["limit_w"] for ln in lines if ln.get("source") == "gpu" and ln.get("limit_w")]
        if limits:
            axes[3].axhline(max(limits), color="black", linestyle="--", linewidth=1, label="enforced limit")
        axes[3].set_ylim(bottom=0)
        axes[3].legend(fontsize=6, loc="lower right")
    else:
        axes[3].text(0.5, 0.5, "GPU not sampled: " + (_why(lines, "gpu") or "no samples"), ha="center", va="center",
                     transform=axes[3].transAxes, fontsize=7)
    axes[3].set_ylabel("power (W)")
    axes[3].set_xlabel("seconds from the measured start (shaded: the measured phase)")
    fig.suptitle(title, fontsize=10)
    return _svg(fig, salt)


def timeline_section(coll: Collection) -> Optional[Section]:
    blocks: list[Block] = []
    shown = skipped = 0
    for variant, runs in coll.variants().items():
        run = next((r for r in runs if r.kind == "bench" and (r.path / "telemetry.jsonl").exists()), None)
        if run is None:
            continue
        lines_by_point, records = read_lines(run.path), _records(run)
        for p in run.view.get("points") or []:
            idx = p.get("index")
            lines = lines_by_point.get(idx) or []
            series = timeline(lines, p, records.get(idx, [])) if lines else {}
            if not series:
                continue
            if shown >= MAX_FIGURES:
                skipped += 1
                continue
            shown += 1
            title = f"{variant}, {p.get('label')}"
            blocks.append(Figure(timeline_svg(series, lines, title, f"timeline-{shown}"),
                                 f"{title}: requests in flight, the engine's KV-cache usage and queue (its /metrics), "
                                 "GPU power against the enforced limit (NVML), on the client's clock.",
                                 [Link("telemetry.jsonl", run.path / "telemetry.jsonl"),
                                  Link("requests.jsonl", run.path / "requests.jsonl")]))
    queue_rows = [[variant, str(p.get("label")), num(g["waiting"]), str(g["requests"]), ms(g["ttft_p50_ms"])]
                  for variant, runs in coll.variants().items() for r in runs[:1] for p in r.view.get("points") or []
                  for g in (((p.get("figures") or {}).get("telemetry") or {}).get("arrivals") or {})
                  .get("ttft_by_waiting") or []]
    if queue_rows:
        blocks.append(Para(["TTFT against the engine's queue each request met on arrival (its last /metrics sample "
                            "before the request was sent; first repeat of each variant):"]))
        blocks.append(Table(["variant", "point", "waiting in the engine at arrival", "requests", "TTFT p50"],
                            queue_rows))
    if not blocks:
        return None
    if skipped:
        blocks.append(Para([f"{skipped} more points not drawn (the first {MAX_FIGURES} are); each run folder's "
                            "telemetry.jsonl holds them."]))
    return Section("timeline", "What the engine and the GPUs did during each point", blocks)
