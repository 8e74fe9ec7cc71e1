"""Energy in the report: the Pareto's energy option (output tokens per joule against per-user speed) and a
table per point (joules per output token and per request, power against the enforced limit, where the
energy figure came from). Present only when some point's GPUs were sampled (telemetry/figures.py);
pure over the collected runs, as report/pareto.py is, with the plot drawn by report/plots.py's Pareto."""

from __future__ import annotations

from typing import Any, Optional

from servedeck.report.blocks import Figure, Link, Para, Section, Table
from servedeck.report.collect import Collection, Run
from servedeck.report.pareto import ParetoRow, _why_not, frontier, load_points
from servedeck.report.render import num
from servedeck.report.stats import spread


def gpu_of(fig: dict[str, Any]) -> dict[str, Any]:
    """A point's GPU telemetry figures ({} when the point has none)."""
    return ((fig.get("telemetry") or {}).get("gpu") or {}) if isinstance(fig, dict) else {}


def j_per_token(runs: list[Run], label: str) -> list[float]:
    """Joules per output token of one load point, one per run that has it (compare's energy figure)."""
    out = []
    for r in runs:
        for p in r.view.get("points") or []:
            v = gpu_of(p.get("figures") or {}).get("j_per_output_token")
            if p.get("label") == label and isinstance(v, (int, float)):
                out.append(float(v))
    return out


def energy_rows(coll: Collection) -> list[ParetoRow]:
    """Per (variant, point): x = per-user output tok/s (1 / TPOT p50), y = output tokens per joule; mean
    across repeats; points with no energy figure are left out."""
    rows = []
    for lp in load_points(coll):
        if lp.curve != "load":
            continue
        ys = [g["output_tokens_per_j"] for g in map(gpu_of, lp.figures)
              if isinstance(g.get("output_tokens_per_j"), (int, float))]
        if not ys:
            continue
        xs = [1000.0 / t for t in lp.values("tpot_ms") if t > 0]
        rows.append(ParetoRow(lp, spread(xs).mean, spread(ys).mean, "joule", _why_not(lp)))
    frontier(rows)
    return rows


def _mean(values: list[Any]) -> Optional[float]:
    vs = [float(v) for v in values if isinstance(v, (int, float))]
    return sum(vs) / len(vs) if vs else None


def energy_section(coll: Collection) -> Optional[Section]:
    rows = energy_rows(coll)
    if not rows:
        return None
    from servedeck.report.plots import _svg, pareto_figure

    fig = pareto_figure(rows, list(coll.variants()))
    ax = fig.axes[0]
    ax.set_ylabel("output tokens per joule (GPU energy)")
    ax.set_title("Energy against per-user speed" + ("" if any(r.eligible for r in rows)
                                                    else " — NOT A RESULT: no point counts (hollow)"), fontsize=10)
    table = []
    for r in rows:
        gs = [gpu_of(f) for f in r.point.figures]
        sources = sorted({str(g.get("energy_source")) for g in gs if g.get("energy_source")})
        share = _mean([g.get("max_share_of_limit") for g in gs])
        table.append([r.point.variant, r.point.label, num(r.x), num(r.y),
                      num(_mean([g.get("j_per_output_token") for g in gs])),
                      num(_mean([g.get("j_per_request") for g in gs])),
                      num(_mean([g.get("mean_power_w") for g in gs])), num(_mean([g.get("max_power_w") for g in gs])),
                      "-" if share is None else f"{share:.0%}", ", ".join(sources),
                      str(sum(int(g.get("missed") or 0) for g in gs)),
                      "on the frontier" if r.on_frontier else ("dominated" if r.eligible else
                                                               "hollow: " + "; ".join(r.why_not))])
    paths = sorted({x.path for row in rows for x in row.point.runs})
    return Section("energy", "Energy per token", [
        Figure(_svg(fig, "energy-pareto"),
               "x = per-user output tok/s (1 / TPOT p50), y = output tokens per joule over each point's measured "
               "window (the GPUs the launch used); mean across repeats; hollow markers are not results.",
               [Link(p.name + "/telemetry.jsonl", p / "telemetry.jsonl") for p in paths]),
        Table(["variant", "point", "per-user tok/s", "output tokens / J", "J / output token", "J / request",
               "mean W", "max W", "max share of limit", "energy from", "samples missed", "frontier"], table),
        Para(["Energy comes from NVML's energy counter, read off at the measured window's edges; where a GPU "
              "has no counter it is power integrated over the window, and 'energy from' says so. NVML's power "
              "reading is a 1-s average on Hopper: max W understates short peaks."])])
