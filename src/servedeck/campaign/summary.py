"""campaign.md and `campaign status`: the cells and a variant × point table, rebuilt from the run folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

from servedeck.mdtable import table_lines
from servedeck.report.capacity import campaign_section, capacity_rows
from servedeck.report.recommend import outputs_of
from servedeck.report.render import gate_cell, headline_cell
from servedeck.runs.read import load


def _num(x: Optional[float], digits: int = 1) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _workload_runs(doc: dict[str, Any], runs_root: Path) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(cell, run folder name, its view) for every workload run (not a gate's) of every cell, rebuilt from its folder."""
    for cell in doc.get("cells", []):
        for run in cell.get("runs", []):
            path = runs_root / run
            if path.exists() and (view := load(path)).get("kind") == "bench":
                yield cell, run, view


def point_rows(doc: dict[str, Any], runs_root: Path) -> list[dict[str, Any]]:
    """One row per measured point of every workload run of every cell, figures from requests.jsonl."""
    rows = []
    for cell, run, view in _workload_runs(doc, runs_root):
        gate = view["gate"]
        g = gate.get("result") or {}
        gate_txt = gate["status"] if not g.get("probes") else f"{gate['status']} {g.get('found')}/{g.get('probes')}"
        for p in view.get("points", []):
            f = p.get("figures") or {}
            rows.append({"variant": cell["variant"], "cell": cell["id"], "run": run,
                         "workload": (view.get("workload") or {}).get("workload"), "point": p.get("label"),
                         "status": p.get("status"),
                         "output_tok_s": f.get("output_tok_s"),
                         "per_user_tok_s_p50": (f.get("per_user_tok_s") or {}).get("p50"),
                         "ttft_p50_ms": (f.get("ttft_ms") or {}).get("p50"),
                         "ok": (f.get("counts") or {}).get("ok"), "errors": (f.get("counts") or {}).get("error"),
                         "gate": gate_txt, "replicas": [r.get("requests") for r in p.get("replicas") or []] or None})
    return rows


def stretch_rows(doc: dict[str, Any], runs_root: Path) -> list[dict[str, Any]]:
    """One row per workload run without load points (a ramp's conversation): its figures in a line, as its kind
    writes them for `servedeck runs` (workloads/kinds.py)."""
    rows = []
    for cell, run, view in _workload_runs(doc, runs_root):
        if not view.get("points"):
            rows.append({"variant": cell["variant"], "cell": cell["id"], "run": run,
                         "workload": (view.get("workload") or {}).get("workload"), "status": view.get("status"),
                         "figures": headline_cell(view), "gate": gate_cell(view)})
    return rows


def stretch_table(rows: list[dict[str, Any]]) -> list[str]:
    return table_lines(["variant", "workload", "status", "figures", "gate"],
                       [[r["variant"], r["workload"], r["status"], r["figures"].replace("|", "/"), r["gate"]]
                        for r in rows])


def capacity_of(doc: dict[str, Any], runs_root: Path) -> list[dict[str, Any]]:
    """Per variant and SLO, the capacity its searches found (report/capacity.py), from the run folders, with
    each variant's greedy outputs against the reference variant's (the recommendation reads both)."""
    views = [load(runs_root / run) for cell in doc.get("cells", []) for run in cell.get("runs", [])
             if (runs_root / run).exists()]
    return capacity_rows([v for v in views if v.get("capacity")], outputs=outputs_of(doc))


def status_view(doc: dict[str, Any], runs_root: Path, folder: Path) -> dict[str, Any]:
    cells = doc.get("cells", [])
    counts: dict[str, int] = {}
    for c in cells:
        counts[c["state"]] = counts.get(c["state"], 0) + 1
    return {"folder": str(folder), "name": doc.get("name"), "file": doc.get("file"), "model": doc.get("model"),
            "started": doc.get("started"), "updated": doc.get("updated"), "counts": counts, "cells": cells,
            "points": point_rows(doc, runs_root), "stretches": stretch_rows(doc, runs_root),
            "capacity": capacity_of(doc, runs_root)}


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = ["variant", "workload", "point", "output tok/s", "per-user tok/s p50", "TTFT p50 ms", "ok/err", "gate",
            "per replica"]
    return table_lines(head, [[r["variant"], r["workload"], r["point"], _num(r["output_tok_s"]),
                               _num(r["per_user_tok_s_p50"]), _num(r["ttft_p50_ms"], 0), f"{r['ok']}/{r['errors']}",
                               r["gate"], "/".join(str(x) for x in r["replicas"]) if r["replicas"] else ""]
                              for r in rows], "lllrrrrll")


def status_markdown(view: dict[str, Any]) -> str:
    """`campaign status` for a pipe or a file: the cells and the figures as markdown tables, whole lines
    (a terminal gets rich's tables; text written elsewhere must not be cut at 80 columns)."""
    lines = [f"campaign {view.get('name')} ({view.get('folder')})", "",
             *table_lines(["cell", "state", "runs", "reason"], [[c["id"], c["state"], len(c.get("runs") or []),
                                                                 c.get("reason") or ""] for c in view.get("cells") or []])]
    if view.get("points"):
        lines += ["", *table(view["points"]), "", "A figure whose gate is not `passed` is recorded but is not a result."]
    if view.get("stretches"):
        lines += ["", *stretch_table(view["stretches"])]
    if view.get("capacity"):
        lines += ["", *campaign_section(view["capacity"])]
    return "\n".join(lines) + "\n"


def render_markdown(doc: dict[str, Any], runs_root: Path) -> str:
    lines = [f"# Campaign {doc.get('name')}", "",
             f"File `{doc.get('file')}`, model `{doc.get('model')}`, host `{doc.get('host')}`; "
             f"started {doc.get('started')}, updated {doc.get('updated')}.", "", "## Cells", "",
             *table_lines(["cell", "state", "runs", "reason"], [[c["id"], c["state"], len(c.get("runs") or []),
                                                                 (c.get("reason") or "")[:200]] for c in doc.get("cells", [])])]
    rows = point_rows(doc, runs_root)
    if rows:
        lines += ["", "## Figures (from each run's requests.jsonl)", "", *table(rows)]
    stretches = stretch_rows(doc, runs_root)
    if stretches:
        lines += ["", "## Runs without load points (a ramp's conversation)", "", *stretch_table(stretches)]
    capacity = capacity_of(doc, runs_root)
    if capacity:
        lines += ["", *campaign_section(capacity)]
    ovr = doc.get("outputs_vs_reference")
    if ovr:
        lines += ["", f"## Greedy outputs against the reference variant `{ovr.get('reference')}`", ""]
        if ovr.get("note"):
            lines.append(ovr["note"])
        rows = []
        for cell, r in (ovr.get("cells") or {}).items():
            d = r.get("first_difference") or {}
            where = (f"prompt {d.get('index')}, {d.get('unit', 'token')} {d.get('position')}: "
                     f"{str(d.get('a'))[:40]!r} vs {str(d.get('b'))[:40]!r}") if d.get("verdict") == "differs" else \
                (d.get("why") or "")
            rows.append([cell, r.get("verdict"), f"{r.get('identical')}/{r.get('prompts')}", where])
        lines += table_lines(["cell", "verdict", "identical prompts", "first difference"], rows, "llrl")
    lines += ["", "A figure whose gate is not `passed` is recorded but is not a result."]
    return "\n".join(lines) + "\n"
