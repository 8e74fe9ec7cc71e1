"""The runs a report or comparison is about, read from their folders alone.

Two ways in: a campaign folder (campaign.json names its cells, their variants and repeats, and the
run folders each produced; see docs/report.md for the contract), or run folders given one by one.
Loose runs are grouped into variants by their configuration knobs (report/knobs.py): runs launched
the same way are repeats of one variant; the variant's name says how it differs from the first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from servedeck.doctor.forensics import classify, read_log
from servedeck.errors import RunError
from servedeck.fsio import tail_text
from servedeck.report.knobs import changed, config_knobs, knobs_of
from servedeck.workloads.kinds import curve_of
from servedeck.runs.read import load, summary_of

EXCERPT_LINES = 12


@dataclass
class Run:
    """One run folder as a report sees it."""

    path: Path
    view: dict[str, Any]
    knobs: dict[str, str]
    variant: str = ""
    repeat: int = 1
    cell: Optional[str] = None
    # the knobs the campaign's user set for this run's variant (campaign.json `knobs`, e.g.
    # {"args.parallel": 8}; {} for a base that sets none); None for loose runs, which have no declaration
    declared: Optional[dict[str, Any]] = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def kind(self) -> str:
        return str(self.view.get("kind") or "")

    @property
    def workload(self) -> str:
        return str((self.view.get("workload") or {}).get("workload") or "")

    @property
    def curve(self) -> Optional[str]:
        """Where its points go: "load" (latency, Pareto, energy against load) or "length" (prefill against
        prompt length), as its workload kind says (workloads/kinds.py)."""
        return curve_of(self.view)

    @property
    def workload_key(self) -> str:
        """One `[[workloads]]` entry: two chat entries of one campaign (c=1, then c=8 and c=32) are two
        workloads, and a repeat of either is the same one again."""
        w = self.view.get("workload") or {}
        return f"{self.workload} {','.join(str(p) for p in w.get('points') or [])}"

    @property
    def gate(self) -> str:
        return str((self.view.get("gate") or {}).get("status") or "not run")

    @property
    def gpus_used(self) -> int:
        """GPUs the launch held: summary.json's gpus_used, else tp × pp × dp × replicas on a GPU host; 0 on CPU."""
        v = self.view.get("gpus_used")
        if isinstance(v, int):
            return v
        gpus = self.view.get("gpus") or {}
        if not gpus.get("available") or not gpus.get("gpus"):
            return 0
        m = (self.view.get("config") or {}).get("model") or {}
        n = 1
        for key in ("tp", "pp", "dp"):
            n *= int(m.get(key) or 1)
        return n * int(self.view.get("replicas") or 1)

    @property
    def per(self) -> str:
        return "GPU" if self.gpus_used else "host"

    @property
    def divisor(self) -> int:
        return self.gpus_used or 1


@dataclass
class Failure:
    what: str  # run folder or cell id
    state: str
    reason: str
    cause: str  # classified (doctor/signatures.toml), or the recorded signature
    excerpt: str
    source: Optional[Path]  # the file the excerpt is from


@dataclass
class Collection:
    title: str
    runs: list[Run]
    failures: list[Failure] = field(default_factory=list)
    campaign: Optional[dict[str, Any]] = None
    folder: Optional[Path] = None  # the campaign folder
    base_variant: Optional[str] = None

    def variants(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = {}
        for r in self.runs:
            out.setdefault(r.variant, []).append(r)
        return out

    def bench_runs(self, curve: Optional[str] = None) -> list[Run]:
        """The runs of a workload (not a gate's), those whose points go on `curve` when given."""
        return [r for r in self.runs if r.kind == "bench" and (curve is None or r.curve == curve)]


def _read(path: Path) -> Run:
    return Run(path=path, view=load(path), knobs=knobs_of(path, summary_of(path)))


def failure_of(run: Run) -> Failure:
    log = run.path / "server.log"
    tail = tail_text(log, 200) if log.exists() else ""
    # the cause may be far above the end (a cascade follows it): looked for in the whole log, the excerpt is its end
    whole = read_log(log) if tail else ""
    cause = classify(whole, None, [], engine=run.view.get("engine")) if tail else None
    lines = tail.splitlines()[-EXCERPT_LINES:]
    return Failure(what=run.name, state=str(run.view.get("status")), reason=str(run.view.get("reason") or "-"),
                   cause=(cause or {}).get("summary") or "no engine log in the run folder",
                   excerpt="\n".join(lines), source=log if tail else None)


def declared_knobs(run: Run) -> Optional[dict[str, Any]]:
    """The campaign knobs of a run a campaign made, read from that campaign's campaign.json (summary.json
    `campaign.folder` under the same results tree), or None: a run given on its own still credits what
    its campaign's user changed."""
    c = run.view.get("campaign") or {}
    if not c.get("folder") or not c.get("variant"):
        return None
    try:
        doc = json.loads((run.path.parent.parent / "campaigns" / str(c["folder"]) / "campaign.json").read_text())
        return dict((doc["variants"][c["variant"]] or {}).get("knobs") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def from_runs(paths: list[Path]) -> Collection:
    """Loose run folders: variants by configuration, repeats in time order."""
    runs = [_read(p) for p in paths]
    for r in runs:
        r.declared = declared_knobs(r)
    groups: list[tuple[dict[str, str], list[Run]]] = []
    for r in runs:
        cfg = config_knobs(r.knobs)
        for known, members in groups:
            if _same_launch(known, cfg):
                members.append(r)
                break
        else:
            groups.append((cfg, [r]))
    base_cfg = groups[0][0] if groups else {}
    names: set[str] = set()
    for i, (cfg, members) in enumerate(groups):
        name = f"{cfg.get('model')} {cfg.get('layout')}"
        if i:
            diff = [c for c in changed(base_cfg, cfg) if c[0] not in ("model", "layout")]
            if name in names or diff:
                name += " (" + ", ".join(f"{n.removeprefix('flag ').removeprefix('env ')} {y}" for n, _, y in diff[:2]) \
                        + (", …" if len(diff) > 2 else "") + ")"
        while name in names:
            name += "'"
        names.add(name)
        for r in members:
            r.variant = name
        # repeats: each workload's runs in time order (folder names carry the time stamp)
        seen: dict[str, int] = {}
        for r in sorted(members, key=lambda r: r.name.split("__")[-1]):
            key = r.workload or r.kind
            seen[key] = seen.get(key, 0) + 1
            r.repeat = seen[key]
    fails = [failure_of(r) for r in runs if r.view.get("status") == "failed"]
    title = runs[0].knobs.get("model", "runs") if len({r.knobs.get("model") for r in runs}) == 1 else "runs"
    return Collection(title=f"{title}: {len(runs)} run{'s' if len(runs) != 1 else ''}", runs=runs, failures=fails,
                      base_variant=runs[0].variant if runs else None)


def _same_launch(a: dict[str, str], b: dict[str, str]) -> bool:
    # the port a server listens on does not make it a different configuration
    ignore = {"flag --port"}
    return {k: v for k, v in a.items() if k not in ignore} == {k: v for k, v in b.items() if k not in ignore}


def is_campaign(path: Path) -> bool:
    return (path / "campaign.json").is_file()


def from_campaign(folder: Path) -> Collection:
    """A campaign folder (`<results>/campaigns/<name>__<stamp>/`): cells → run folders under `<results>/runs`."""
    try:
        doc = json.loads((folder / "campaign.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"{folder / 'campaign.json'} cannot be read: {e}",
                       hint="give a campaign folder (one that holds run folders), or run folders") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise RunError(f"{folder / 'campaign.json'} has no `cells` list", hint="is it a campaign folder?")
    runs_dir = folder.parent.parent / "runs"
    runs: list[Run] = []
    fails: list[Failure] = []
    for cell in doc["cells"]:
        made: list[Run] = []
        for name in cell.get("runs") or []:
            p = runs_dir / name
            if not p.is_dir():
                fails.append(Failure(what=f"cell {cell.get('id')}", state="missing",
                                     reason=f"run folder {p} named in campaign.json does not exist", cause="-",
                                     excerpt="", source=None))
                continue
            r = _read(p)
            r.variant, r.repeat, r.cell = str(cell.get("variant")), int(cell.get("repeat") or 1), cell.get("id")
            r.declared = dict(((doc.get("variants") or {}).get(r.variant) or {}).get("knobs") or {})
            made.append(r)
            if r.view.get("status") == "failed":
                fails.append(failure_of(r))
        runs += made
        if cell.get("state") in ("failed", "timed-out") and not any(r.view.get("status") == "failed" for r in made):
            f = failure_of(made[-1]) if made else Failure(what="", state="", reason="", cause="", excerpt="",
                                                          source=None)
            fails.append(Failure(what=f"cell {cell.get('id')}", state=str(cell.get("state")),
                                 reason=str(cell.get("reason") or "-"),
                                 cause=str(cell.get("signature") or f.cause or "-"), excerpt=f.excerpt,
                                 source=f.source))
    return Collection(title=f"campaign {doc.get('name')} ({doc.get('model')})", runs=runs, failures=fails,
                      campaign=doc, folder=folder, base_variant=doc.get("base_variant"))


def collect(paths: list[Path]) -> Collection:
    if len(paths) == 1 and is_campaign(paths[0]):
        return from_campaign(paths[0])
    if any(is_campaign(p) for p in paths):
        raise RunError("give either one campaign folder or run folders, not both",
                       hint="`servedeck report CAMPAIGN_FOLDER` or `servedeck report RUN RUN …`")
    if not paths:
        raise RunError("nothing to report on", hint="give a campaign folder or run folders (`servedeck runs` lists them)")
    return from_runs(paths)
