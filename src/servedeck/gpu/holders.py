"""Who holds each GPU's memory: NVML pids mapped to servedeck models.

A vLLM engine's memory is held by its EngineCore / worker processes, children of the pid servedeck
started, not by that pid itself; llama-server holds it directly. So a model owns every process in
its live record's process group plus every descendant of its pid (a child that called setsid()
leaves the group but stays a descendant). Pids that map to no model are described by name and
user, so a refusal can say "python (pid 4242, user bob) on GPU 0 holds 40.0 GiB".

`pid_owners()` is the effect (psutil); `attribute()` is a pure function over its result.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

import psutil

from servedeck import paths
from servedeck.gpu.nvml import Inventory, gib

# A live record's pid can be reused after a crash; a process born this long after the recorded
# start is not the one servedeck launched.
PID_REUSE_SLACK_S = 120.0


@dataclass(frozen=True)
class Holding:
    gpu: int
    pid: int
    used_bytes: int | None
    model: str | None  # the servedeck model that owns the pid, or None
    process: str  # process name, or "?" when it is gone or hidden
    user: str | None = None
    cmdline: str = ""
    asleep_level: int | None = None  # its model sleeps (deck state asleep), at this level

    def describe(self) -> str:
        who = self.model if self.model else f"{self.process} (pid {self.pid}{', user ' + self.user if self.user else ''})"
        if self.asleep_level:
            return f"{who} (asleep) on GPU {self.gpu} holds {gib(self.used_bytes)}; `servedeck stop {who}` frees it"
        return f"{who} on GPU {self.gpu} holds {gib(self.used_bytes)}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def live_records(live_dir: Path | None = None) -> list[dict[str, Any]]:
    """The deck's live records ($SERVEDECK_HOME/live/<model>.json). A torn or foreign file is skipped:
    attribution is advisory and must not fail because one record is bad."""
    d = live_dir or paths.live_dir()
    out = []
    for f in sorted(d.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and "pid" in rec:
            rec.setdefault("model", f.stem)
            out.append(rec)
    return out


def _epoch(v: Any) -> float | None:
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _root(rec: Mapping[str, Any]) -> tuple[psutil.Process | None, bool]:
    """(the recorded process if it still runs, whether its pid now belongs to a different process)."""
    try:
        proc = psutil.Process(int(rec["pid"]))
        if rec.get("create_time") is not None:  # the deck records the exact birth time: compare it
            same = abs(proc.create_time() - float(rec["create_time"])) < 1.0
        else:
            started = _epoch(rec.get("started_at"))
            same = started is None or proc.create_time() <= started + PID_REUSE_SLACK_S
        return (proc, False) if same else (None, True)
    except (psutil.Error, ValueError, TypeError, KeyError):
        return None, False


def model_pids(rec: Mapping[str, Any], procs: Iterable[psutil.Process] | None = None) -> set[int]:
    """Every pid that belongs to one live record: its pid, its descendants, its process group.
    When the recorded pid is gone, its group is still scanned: orphaned engine workers hold GPU memory
    too. When the pid was reused by another process, nothing is claimed (the numbers mean someone else)."""
    pids: set[int] = set()
    root, reused = _root(rec)
    if reused:
        return pids
    if root is not None:
        pids.add(root.pid)
        try:
            pids.update(c.pid for c in root.children(recursive=True))
        except psutil.Error:
            pass
    pgid = rec.get("pgid")
    if pgid:
        for p in procs if procs is not None else psutil.process_iter():
            try:
                if os.getpgid(p.pid) == int(pgid):
                    pids.add(p.pid)
            except (ProcessLookupError, PermissionError, psutil.Error, OSError):
                continue
    return pids


def pid_owners(records: list[Mapping[str, Any]] | None = None) -> dict[int, str]:
    """pid → model for every process of every live record."""
    records = live_records() if records is None else records
    procs = list(psutil.process_iter())
    owners: dict[int, str] = {}
    for rec in records:
        for pid in model_pids(rec, procs):
            owners.setdefault(pid, str(rec.get("model")))
    return owners


def describe_pid(pid: int) -> tuple[str, str | None, str]:
    """(name, user, cmdline) of a pid; ("?", None, "") when it is gone or in another pid namespace."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            name = p.name()
            try:
                user = p.username()
            except (psutil.Error, KeyError):
                user = None
            try:
                cmd = " ".join(p.cmdline())[:200]
            except psutil.Error:
                cmd = ""
        return name, user, cmd
    except psutil.Error:
        return "?", None, ""


def attribute(
    inv: Inventory,
    owners: Mapping[int, str],
    describe: Mapping[int, tuple[str, str | None, str]] | None = None,
    asleep: Mapping[str, int] | None = None,
) -> list[Holding]:
    """Pure: one Holding per (GPU, process), owned by a model when its pid is in `owners`; `asleep`:
    the models that sleep, by level."""
    describe = describe or {}
    asleep = asleep or {}
    out = []
    for g in inv.gpus:
        for p in g.processes:
            name, user, cmd = describe.get(p.pid, ("?", None, ""))
            model = owners.get(p.pid)
            out.append(Holding(gpu=g.index, pid=p.pid, used_bytes=p.used_bytes, model=model,
                               process=name, user=user, cmdline=cmd, asleep_level=asleep.get(model) if model else None))
    return out


def asleep_models(records: list[Mapping[str, Any]]) -> dict[str, int]:
    """The models whose live record says they sleep, by level."""
    return {str(r.get("model")): int(r.get("sleep_level") or 1) for r in records if r.get("state") == "asleep"}


def holders(inv: Inventory, records: list[Mapping[str, Any]] | None = None) -> list[Holding]:
    """Effectful convenience: attribute every GPU process of `inv` to a model or a named process."""
    records = live_records() if records is None else records
    owners = pid_owners(records)
    return attribute(inv, owners, {pid: describe_pid(pid) for pid in inv.pids()}, asleep_models(records))


def by_holder(holdings: Iterable[Holding], gpu: int) -> list[tuple[str, int | None]]:
    """One GPU's usage summed per holder (a vLLM model with several worker pids counts once),
    largest first: [("gemma", bytes), ("python (pid 7, user bob)", bytes)]."""
    sums: dict[str, int | None] = {}
    for h in holdings:
        if h.gpu != gpu:
            continue
        key = h.model or f"{h.process} (pid {h.pid}{', user ' + h.user if h.user else ''})"
        prev = sums.get(key, 0)
        sums[key] = None if (prev is None or h.used_bytes is None) else prev + h.used_bytes
    return sorted(sums.items(), key=lambda kv: -(kv[1] or 0))


def describe_gpu_holders(holdings: Iterable[Holding], gpu: int, skip: Iterable[str] = ()) -> list[str]:
    """["gemma on GPU 0 holds 93.5 GiB", "qwen (asleep) on GPU 0 holds 1.9 GiB; `servedeck stop qwen` frees
    it", ...] — the words a refusal uses (`skip`: holders not to name)."""
    skip = set(skip)
    holdings = list(holdings)
    asleep = {h.model for h in holdings if h.model and h.asleep_level}
    out = []
    for who, used in by_holder(holdings, gpu):
        if who in skip:
            continue
        if who in asleep:
            out.append(f"{who} (asleep) on GPU {gpu} holds {gib(used)}; `servedeck stop {who}` frees it")
        else:
            out.append(f"{who} on GPU {gpu} holds {gib(used)}")
    return out


def model_gpu_use(model: str, holdings: Iterable[Holding]) -> dict[int, int]:
    """Bytes a model holds on each GPU (what record_measurement stores as the measured peak)."""
    out: dict[int, int] = {}
    for h in holdings:
        if h.model == model and h.used_bytes is not None:
            out[h.gpu] = out.get(h.gpu, 0) + h.used_bytes
    return out
