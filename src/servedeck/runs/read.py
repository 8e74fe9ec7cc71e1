"""Reading run folders back: find them, list them, and rebuild a run's view from its files alone.

The view is summary.json's facts (what ran, where, with what) with every figure recomputed from
requests.jsonl (the figures of the run's workload kind too: workloads/kinds.py) and every gate rescored from its
record (niah.log, eval.jsonl), so a summary written by a crashed or older servedeck cannot show numbers its own
records do not support.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servedeck.errors import RunError
from servedeck.fsio import read_jsonl
from servedeck.gates.kinds import gates_view
from servedeck.loadgen.records import RequestRecord
from servedeck.runs.figures import add_figures, headline, point_figures
from servedeck.supervisor.process import alive
from servedeck.telemetry.figures import point_telemetry, read_lines as read_telemetry
from servedeck.workloads.kinds import kind_of

RUN_FILES = ("summary.json", "requests.jsonl", "niah.log")


def list_runs(root: Path) -> list[Path]:
    """Run folders under `root`, oldest first (by the time stamp in their name, then mtime)."""
    if not root.exists():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and any((p / f).exists() for f in RUN_FILES)]

    def stamp(p: Path) -> tuple[str, float]:
        parts = p.name.split("__")
        return (parts[4] if len(parts) >= 5 else "", p.stat().st_mtime)

    return sorted(runs, key=stamp)


def find_run(root: Path, ref: str) -> Path:
    """A run by path, folder name, `last`, or a fragment of its name that matches exactly one run."""
    p = Path(ref).expanduser()
    if p.is_dir() and any((p / f).exists() for f in RUN_FILES):
        return p
    runs = list_runs(root)
    if not runs:
        raise RunError(f"no runs under {root}", hint="run `servedeck gate MODEL` or `servedeck bench MODEL` first")
    if ref in ("last", "-1", "latest"):
        return runs[-1]
    exact = [r for r in runs if r.name == ref]
    if exact:
        return exact[0]
    matches = [r for r in runs if ref in r.name]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunError(f"no run matching {ref!r} under {root}", hint="`servedeck runs` lists them")
    names = ", ".join(m.name for m in matches[-5:])
    raise RunError(f"{ref!r} matches {len(matches)} runs ({names}{', …' if len(matches) > 5 else ''})",
                   hint="give more of the name, or `last`")


class _SummaryShape(BaseModel):
    """The keys of summary.json that every reader takes apart (runs, show, report, compare), with the
    shape they need. Other keys are carried as they are."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    schema_: Optional[int] = Field(default=None, alias="schema")
    run: Optional[str] = None
    status: Optional[Literal["running", "ok", "failed"]] = None
    reason: Optional[str] = None
    pid: Optional[int] = None
    kind: Optional[str] = None
    model: Optional[str] = None
    engine: Optional[str] = None
    layout: Optional[str] = None
    points: Optional[list[dict[str, Any]]] = None
    workload: Optional[dict[str, Any]] = None
    gates: Optional[dict[str, Any]] = None
    launch: Optional[dict[str, Any]] = None
    campaign: Optional[dict[str, Any]] = None
    ramp: Optional[dict[str, Any]] = None
    conversations: Optional[dict[str, Any]] = None
    shared_prefix: Optional[dict[str, Any]] = None


def read_summary(path: Path) -> tuple[dict[str, Any], list[str]]:
    """summary.json, its keys of the wrong shape left out, and one sentence per key left out (or for a
    file that cannot be read at all). ({}, []) when the folder has none."""
    f = path / "summary.json"
    try:
        doc = json.loads(f.read_text())
    except FileNotFoundError:
        return {}, []
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        return {}, [f"{f}: cannot be read ({e})"]
    if not isinstance(doc, dict):
        return {}, [f"{f}: not a JSON object"]
    try:
        _SummaryShape.model_validate(doc)
        return doc, []
    except ValidationError as e:
        bad: dict[str, str] = {}
        for err in e.errors():
            key = str(err["loc"][0])
            where = ".".join(str(p) for p in err["loc"])
            bad.setdefault(key, f"{f}: {where}: {err['msg']} (got {_short(err.get('input'))}); left out")
        return {k: v for k, v in doc.items() if k not in bad}, list(bad.values())


def _short(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def summary_of(path: Path) -> dict[str, Any]:
    """summary.json as `read_summary` keeps it: {} when missing or unreadable, wrong-shaped keys left out."""
    return read_summary(path)[0]


def _from_name(path: Path) -> dict[str, Any]:
    parts = path.name.split("__")
    keys = ("model", "layout", "ctx_label", "engine", "stamp")
    return dict(zip(keys, parts)) if len(parts) >= 5 else {}


def result_label(view: dict[str, Any]) -> str:
    """How every listing marks a run: a failed run, a failed/missing gate, or a result."""
    gate = view["gate"]["status"]
    if view.get("status") == "failed":
        tag = "FAILED"
    elif view.get("status") == "running":
        tag = "running"
    else:
        tag = "ok"
    if view.get("kind") == "gate":
        return f"{tag}; gate {gate}"
    mark = {"passed": "result", "failed": "gate failed: not a result", "not run": "no gate: not a result",
            "incomplete": "gate incomplete: not a result"}[gate]
    return f"{tag}; {mark}"


def load(path: Path) -> dict[str, Any]:
    """Rebuild a run's view from its folder."""
    summary, problems = read_summary(path)
    view: dict[str, Any] = {**_from_name(path), **summary, "path": str(path), "run": path.name}
    if not summary:
        view.setdefault("status", "failed")
        view.setdefault("reason", "summary.json missing or unreadable; figures rebuilt from the records alone")
    if problems:  # a summary that cannot be trusted whole is not a result: said, and the records read
        view["status"] = "failed"
        view["reason"] = "; ".join(problems) + "; figures rebuilt from the records"
    if view.get("status") == "running" and not _writer_alive(summary):
        view["status"] = "failed"
        view["reason"] = "servedeck stopped before finishing the run (no final summary was written)"
    # every gate's verdict folded into one (gates/kinds.py): any failed → not a result
    view["gate"] = gates_view(path, summary)
    workload = summary.get("workload") or {}
    kind = kind_of(summary)  # its figures of its own (workloads/shape.py), rebuilt here from its records
    lines = read_jsonl(path / "requests.jsonl")
    by_point: dict[int, list[RequestRecord]] = {}
    bad, first_bad = 0, None
    for line in lines:
        idx = line.pop("point", 0)
        try:
            by_point.setdefault(int(idx), []).append(RequestRecord.from_json(line))
        except (TypeError, ValueError) as e:
            bad += 1
            first_bad = first_bad or f"{type(e).__name__}: {e}"
    points = [dict(p) for p in summary.get("points") or []]
    telemetry = read_telemetry(path)  # telemetry.jsonl by point (telemetry/figures.py)
    known = {p.get("index") for p in points}
    for idx in sorted(by_point):
        if idx not in known:  # a point whose summary entry was never written (crash mid-point)
            points.append({"index": idx, "label": f"point {idx}", "status": "incomplete"})
    for p in points:
        if p.get("status") == "running" and view["status"] == "failed":
            p["status"] = "incomplete"  # the run ended while this point was being prepared or measured
        recs = by_point.get(p.get("index"), [])
        p["figures"] = point_figures(recs, p, workload)
        more = add_figures(p["figures"], kind.point_figures if kind else None, recs)
        p["figures"]["telemetry"] = point_telemetry(telemetry.get(p.get("index"), []), p, recs)
        p["headline"] = {**headline(p["figures"]), **more}
    view["points"] = sorted(points, key=lambda p: p.get("index", 0))
    bad += lines.skipped
    view["requests"] = {"lines": len(lines) + lines.skipped, "unreadable": bad, "torn_last_line": bool(lines.torn),
                        "measured": sum(r.kind == "measured" for rs in by_point.values() for r in rs)}
    view["warnings"] = list(problems)
    if bad:  # never silently: figures below leave these lines out
        view["warnings"].append(f"{bad} of {len(lines) + lines.skipped} lines of requests.jsonl could not be read "
                                f"and are left out of every figure (first: {lines.first_error or first_bad})")
    if kind is not None and kind.view is not None:
        view.update(kind.view(path, view, [r for rs in by_point.values() for r in rs]))
    view["label"] = result_label(view)
    return view


def _writer_alive(summary: dict[str, Any]) -> bool:
    pid = summary.get("pid")
    return isinstance(pid, int) and alive(pid)
