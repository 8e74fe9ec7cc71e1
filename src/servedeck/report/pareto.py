"""Throughput against latency: one point per (variant, load point), the Pareto frontier among the
points that count. Pure: from collected runs to rows; the plot is report/plots.py's.

x = per-user output tok/s = 1 / TPOT (the median request's), y = output tok/s per GPU (GPUs the
launch held: tp × pp × dp × replicas; a CPU run is "per host"). With repeats, each is the mean across
repeats. A point counts for the frontier only when every run behind it passed its gate, no point
was client-bound, and it finished; the others are drawn hollow and say why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from servedeck.report.collect import Collection, Run
from servedeck.report.stats import Spread, spread


@dataclass
class LoadPoint:
    """One (variant, load point) across its repeats."""

    variant: str
    label: str  # c=4, rate=2/s poisson
    order: float  # concurrency or rate, for sorting and the x of latency plots
    loop: str  # closed | open
    workload: str
    runs: list[Run]
    figures: list[dict[str, Any]]  # one per run, same order
    curve: Optional[str] = "load"  # where its kind's points go (workloads/kinds.py): "load" or "length"

    def values(self, key: str, stat: str = "p50") -> list[float]:
        out = []
        for f in self.figures:
            v = f.get(key)
            v = v.get(stat) if isinstance(v, dict) else v
            if isinstance(v, (int, float)):
                out.append(float(v))
        return out

    def spread(self, key: str, stat: str = "p50") -> Spread:
        return spread(self.values(key, stat))


@dataclass
class ParetoRow:
    point: LoadPoint
    x: Optional[float]  # per-user tok/s
    y: Optional[float]  # output tok/s per GPU (or per host)
    per: str
    why_not: list[str] = field(default_factory=list)  # empty: eligible for the frontier
    on_frontier: bool = False

    @property
    def eligible(self) -> bool:
        return not self.why_not


def load_points(coll: Collection, curve: Optional[str] = None) -> list[LoadPoint]:
    """Every measured point of every bench run (those whose kind puts them on `curve`, when given), grouped across
    repeats by (variant, workload, label)."""
    groups: dict[tuple[str, str, str], LoadPoint] = {}
    for run in coll.bench_runs(curve):
        for p in run.view.get("points") or []:
            shape = p.get("shape") or {}
            loop = shape.get("type") or "closed"
            order = float(shape.get("concurrency") or shape.get("rate") or p.get("index") or 0)
            key = (run.variant, run.workload, p.get("label"))
            lp = groups.get(key)
            if lp is None:
                lp = groups[key] = LoadPoint(run.variant, str(p.get("label")), order, loop, run.workload, [], [],
                                             run.curve)
            lp.runs.append(run)
            lp.figures.append({**(p.get("figures") or {}), "_status": p.get("status")})
    return sorted(groups.values(), key=lambda lp: (list(coll.variants()).index(lp.variant), lp.loop, lp.order))


def _why_not(lp: LoadPoint) -> list[str]:
    why = []
    gates = {r.gate for r in lp.runs}
    if gates - {"passed"}:
        why.append("gate " + "/".join(sorted(g for g in gates if g != "passed")))
    if any((f.get("client") or {}).get("client_bound") for f in lp.figures):
        why.append("client-bound")
    if any(f.get("_status") not in ("ok", None) for f in lp.figures):
        why.append("point " + "/".join(sorted({str(f.get("_status")) for f in lp.figures if f.get("_status") != "ok"})))
    return why


def frontier(rows: list[ParetoRow]) -> None:
    """Mark the eligible rows no other eligible row beats on both axes (higher is better on both)."""
    elig = [r for r in rows if r.eligible and r.x is not None and r.y is not None]
    for r in elig:
        r.on_frontier = not any((o.x >= r.x and o.y >= r.y) and (o.x > r.x or o.y > r.y)  # type: ignore[operator]
                                for o in elig if o is not r)


def pareto(coll: Collection) -> list[ParetoRow]:
    rows = []
    for lp in load_points(coll):
        if lp.curve != "load":  # prefill against length is not a point of the frontier
            continue
        tpots = lp.values("tpot_ms")
        xs = [1000.0 / t for t in tpots if t > 0]
        ys = [f["output_tok_s"] / r.divisor for f, r in zip(lp.figures, lp.runs)
              if isinstance(f.get("output_tok_s"), (int, float))]
        per = "GPU" if all(r.per == "GPU" for r in lp.runs) else "host"
        rows.append(ParetoRow(lp, spread(xs).mean, spread(ys).mean, per, _why_not(lp)))
    frontier(rows)
    return rows
