"""What a reader must know before trusting a figure, decided from the run folders alone. Pure.

    not_a_result(runs)   a launch whose gate failed, never ran or did not finish: its figures are
                         recorded but are not results (every table and plot built from them says so)
    busy_hosts(coll)     a cell (or a loose run's launch) that began while its host was busy, from the
                         load averages each run recorded when it opened (summary.json host.load_avg)
    point_warnings(coll) each point's own warnings (summary.json figures.warnings: client and server
                         token counts disagreeing, requests served from the prefix cache, a client that
                         set the pace…) and each run's, carried into the report
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

from servedeck.report.collect import Collection, Run

# A unit of launch is busy when its 1-minute load at the start is at least BUSY_RATIO times the median
# of the other units' and at least BUSY_MARGIN above it (a cell that began right after a build), or when
# it is at or above the CPUs the run could use (every core had a runnable task on average).
BUSY_RATIO = 2.0
BUSY_MARGIN = 1.0


def not_a_result(runs: list[Run]) -> Optional[str]:
    """"gate failed" (or "gate not run", "gate failed/not run") when any run's gate did not pass."""
    gates = sorted({r.gate for r in runs} - {"passed"})
    return "gate " + "/".join(gates) if gates else None


def standing(runs: list[Run], busy: dict[str, "Busy"]) -> str:
    """A table's "result" cell for figures from these runs."""
    bits = []
    why = not_a_result(runs)
    bits.append(f"NOT A RESULT: {why}" if why else "result")
    hot = sorted({busy[unit_of(r)].unit for r in runs if unit_of(r) in busy})
    if hot:
        bits.append("host busy at start (" + ", ".join(hot) + ")")
    return "; ".join(bits)


def unit_of(run: Run) -> str:
    """The launch a run belongs to: its campaign cell, else its launch folder, else itself."""
    if run.cell:
        return f"cell {run.cell}"
    launch = (run.view.get("launch") or {}).get("launch_dir")
    return f"launch {launch}" if launch else f"run {run.name}"


@dataclass(frozen=True)
class Busy:
    unit: str  # "cell default#1"
    load: float  # 1-minute load average when the unit's first run opened
    others: Optional[float]  # median of the other units' loads (None: no other unit)
    cpus: Optional[int]
    run: str  # the run whose load this is

    @property
    def text(self) -> str:
        against = (f" against a median of {self.others:.1f} at the other launches' starts"
                   if self.others is not None else "")
        cpus = f" ({self.cpus} usable CPUs)" if self.cpus else ""
        return (f"{self.unit}: the host was busy when it began: load average {self.load:.1f} (1 min){against}"
                f"{cpus}; its figures may be slower than the configuration is")


def _load(run: Run) -> tuple[Optional[float], Optional[int]]:
    host = run.view.get("host") or {}
    la = host.get("load_avg")
    load = float(la[0]) if isinstance(la, (list, tuple)) and la and isinstance(la[0], (int, float)) else None
    cpus = host.get("cpus_usable") or host.get("cpus")
    return load, int(cpus) if isinstance(cpus, int) else None


def busy_hosts(coll: Collection) -> dict[str, Busy]:
    """unit → Busy for every unit of launch that began on a busy host (see BUSY_RATIO)."""
    first: dict[str, Run] = {}
    for r in sorted(coll.runs, key=lambda r: str(r.view.get("created_at") or r.name)):
        first.setdefault(unit_of(r), r)
    loads = {u: _load(r) for u, r in first.items()}
    known = {u: lc for u, lc in loads.items() if lc[0] is not None}
    out: dict[str, Busy] = {}
    for unit, (load, cpus) in known.items():
        assert load is not None
        others = [lc[0] for u, lc in known.items() if u != unit]
        med = statistics.median(others) if others else None  # type: ignore[type-var]
        saturated = cpus is not None and load >= cpus
        above = med is not None and load >= BUSY_RATIO * med and load - med >= BUSY_MARGIN
        if saturated or above:
            out[unit] = Busy(unit, load, med, cpus, first[unit].name)
    return out


@dataclass(frozen=True)
class RunWarning:
    variant: str
    run: Run
    point: str  # a load point's label, or "run" for the run's own warnings
    text: str


def point_warnings(coll: Collection) -> list[RunWarning]:
    out = []
    for r in coll.runs:
        for w in r.view.get("warnings") or []:
            out.append(RunWarning(r.variant, r, "run", str(w)))
        for p in r.view.get("points") or []:
            for w in (p.get("figures") or {}).get("warnings") or []:
                out.append(RunWarning(r.variant, r, str(p.get("label")), str(w)))
    return out


def warnings_of(run: Run, label: str) -> list[str]:
    for p in run.view.get("points") or []:
        if str(p.get("label")) == label:
            return [str(w) for w in (p.get("figures") or {}).get("warnings") or []]
    return []
