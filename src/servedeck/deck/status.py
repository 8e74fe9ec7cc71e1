"""The deck seen from outside, written nowhere: whether a launch is alive, what a dead one became and
why (its exit record, its log, the forensic catalogue), and the `Status` row `servedeck status` shows
for each model. Settling what is found here (recording it, stopping what a dead shim left) is the
deck's (deck.py)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.deck.sleep import gpu_held
from servedeck.deck.sleepops import describe_asleep
from servedeck.errors import ServedeckError
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R

if TYPE_CHECKING:
    from servedeck.doctor.forensics import Footprint


def classify(log: str, exit_info: dict | None, when: float | None, engine: str,
             footprint: "Footprint | None" = None) -> dict:
    """The classified cause of an ending, from the forensic catalogue (doctor/forensics), among the
    signatures that apply to the engine that wrote the log; the kernel's events around `when` are
    weighed only when `footprint` (`footprint_of`) does not say they are another process's."""
    from servedeck.doctor.forensics import classify as catalogue_classify
    from servedeck.doctor.kernel import events_near

    return catalogue_classify(log, exit_info, events_near(when) if when else [], engine=engine, footprint=footprint)


def footprint_of(launch_dir: str | Path, image: str | None, *pids: int | None) -> "Footprint":
    """The launch's processes and GPUs as its folder records them (doctor.forensics.Footprint). Its pids
    are known only when its shim noted them (pids.json) and it ran outside a container: a container's
    processes are not in servedeck's process group, so its kernel events are told by GPU alone."""
    from servedeck.doctor.forensics import Footprint

    d = Path(launch_dir)
    seen = None if image else L.pids_seen(d)
    known = None if seen is None else frozenset([*seen, *(p for p in pids if p)])
    gpus = L.read_launch(d).get("gpus_pci")
    return Footprint(pids=known, gpus=tuple(gpus.values()) if isinstance(gpus, dict) and gpus else None)


def describe_exit(exit_info: dict | None, launch_dir: str | Path | None = None) -> str:
    if not exit_info:
        why = shim_failure(launch_dir) if launch_dir is not None else None
        return why or "the engine's process group is gone and no exit record was written (killed with its shim?)"
    if exit_info.get("signal"):
        return f"killed by {exit_info['signal']}"
    if exit_info.get("error"):
        return exit_info["error"]
    return f"exited with code {exit_info.get('returncode')}"


def shim_failure(launch_dir: str | Path) -> str | None:
    """When a launch's supervisor ended before it started the engine (no engine.json, no exit.json): what
    it said last (an interpreter that cannot import servedeck prints its traceback to engine.log)."""
    d = Path(launch_dir)
    if (d / "engine.json").exists() or (d / "exit.json").exists() or not (d / "engine.log").exists():
        return None
    last = [ln.strip() for ln in L.log_tail(d, 20).splitlines() if ln.strip()]
    said = f": {last[-1][:300]}" if last else " (it printed nothing)"
    return f"its supervisor (python -m servedeck.supervisor.shim) exited before it started the engine{said}"


@dataclass
class Ending:
    """How a launch whose process is gone ended, read from its folder (exit.json, log tail)."""

    state: LaunchState
    exit: Optional[dict]
    cause: Optional[dict]
    tail: str
    left_behind: Optional[dict] = None  # its shim died first: the engine it left, and how the deck stopped it
    unspawned: Optional[str] = None  # its start was cut short before its shim was spawned: by whom
    launch_dir: Optional[str] = None

    @property
    def detail(self) -> str:
        if self.left_behind:
            return self.left_behind["detail"]
        if self.unspawned and not self.exit:
            return self.unspawned
        return describe_exit(self.exit, self.launch_dir)


def ending_of(rec: LiveRecord, left_behind: dict | None = None) -> Ending:
    """Pure but for reading the launch folder: what a dead launch became and why."""
    d = Path(rec.launch_dir)
    exit_info = R.read_exit(d)
    tail = L.log_tail(d, 40)
    state = LaunchState.after_death(rec.state)
    ended = (exit_info or {}).get("ended_at") or time.time()
    cause = None
    if state != LaunchState.STOPPED:
        mine = footprint_of(d, rec.image, rec.pid, rec.engine_pid, engine_record(d).get("engine_pid"))
        cause = classify(L.log_for_causes(d), exit_info, ended, rec.engine, mine)
    if left_behind and not exit_info and cause and cause.get("id") == "unknown":  # nothing in the log or the kernel's: say what is known
        cause = {**cause, "id": "supervisor-killed", "family": "supervisor",
                 "summary": "the supervisor shim was killed from outside (a SIGKILL, or the OOM killer)",
                 "action": "if the kernel log shows the OOM killer, give the host more memory or the model less"}
    unspawned = None
    if rec.pid is None:
        unspawned = (f"its start was cut short before its engine was spawned: the servedeck process that was "
                     f"starting it (pid {rec.owner_pid}) is gone")
    return Ending(state, exit_info, cause, tail, left_behind, unspawned, rec.launch_dir)


def with_spawned(rec: LiveRecord) -> LiveRecord:
    """`rec` with its shim's pid, group and start time: a record written just before its spawn has
    none, and keeps none when its servedeck was killed before writing them; its shim, if one was
    spawned, is then found by its launch folder. Unchanged when nothing is found."""
    if rec.pid is not None:
        return rec
    shim = P.find_shim(rec.launch_dir)
    return replace(rec, pid=shim.pid, pgid=shim.pgid, create_time=shim.create_time) if shim else rec


def owner_alive(rec: LiveRecord) -> bool:
    """Whether the servedeck process that started `rec` still runs (its start time, when recorded,
    tells it from a later process given the same pid)."""
    return bool(rec.owner_pid) and P.alive(rec.owner_pid, rec.owner_create_time)


def alive(rec: LiveRecord) -> bool:
    """Whether `rec`'s shim runs. A record with no shim pid yet (pass it through `with_spawned`
    first) is alive while the servedeck spawning it is: a start under way is not dead."""
    if rec.pid is None:
        return P.find_shim(rec.launch_dir) is not None or owner_alive(rec)
    return P.alive(rec.pid, rec.create_time)


def left_behind(rec: LiveRecord) -> list[int]:
    """The processes of `rec`'s group still running though its shim is gone: its engine, unsupervised.
    The shim's recorded start time guards against a reused pid (supervisor/process.py)."""
    return P.left_in_group(rec.pgid, rec.create_time)


def engine_named(rec: LiveRecord, left: list[int]) -> str:
    """The engine of a launch in words: its own pid (from the live record, or engine.json while it was
    still starting), and how many processes its group still holds when there are more."""
    pid = rec.engine_pid or engine_record(rec.launch_dir).get("engine_pid")
    if pid not in left:
        pid = left[0] if left else pid
    more = f", {len(left)} processes in its group" if len(left) > 1 else ""
    return f"pid {pid}{more}"


def is_orphan(rec: LiveRecord) -> bool:
    """A launch still `starting` whose servedeck process is gone: nobody will ever finish starting it."""
    owner = rec.owner_pid
    return rec.state == LaunchState.STARTING and bool(owner) and owner != os.getpid() and not owner_alive(rec)


def engine_record(launch_dir: str | Path) -> dict:
    """engine.json of a launch folder (the engine's own pid, written by the shim); {} until it exists or
    when it is not an object."""
    try:
        doc = json.loads((Path(launch_dir) / "engine.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) and isinstance(doc.get("engine_pid", 0), (int, type(None))) else {}


def recovered(model: str) -> LiveRecord | None:
    """A live record rebuilt from the model's newest launch folder (launch.json, and its shim found by its
    argv), for a model whose live/<model>.json cannot be read: so that its engine is still seen, and
    stopped by `stop`. None when no shim of that launch runs."""
    past = L.past_launches(model)
    if not past:
        return None
    d = past[-1]
    doc = L.read_launch(d)
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    shim = P.find_shim(d)
    if shim is None:  # nothing of it runs: the file is shown as unreadable and set aside by `stop`
        return None
    try:
        state = LaunchState(doc.get("state", "starting"))
    except ValueError:
        state = LaunchState.STARTING
    try:
        rec = LiveRecord(model=model, engine=str(doc.get("engine") or spec.get("engine") or "?"),
                         build=str(doc.get("build") or "?"), slot=str(doc.get("slot") or spec.get("slot") or "main"),
                         port=int(doc.get("port") or spec.get("port") or 0), launch_dir=str(d),
                         pid=shim.pid, pgid=shim.pgid, create_time=shim.create_time, owner_pid=0,
                         state=state,
                         host=str(spec.get("host") or "127.0.0.1"), served_name=str(spec.get("served_name") or model),
                         base_url=f"http://{_client_host(spec.get('host'))}:{int(doc.get('port') or spec.get('port') or 0)}",
                         health_path=str(spec.get("health_path") or "/health"),
                         stop_timeout_s=float(spec.get("stop_timeout_s") or 120.0), spec=spec,
                         started_at=str(doc.get("started_at") or ""), engine_pid=engine_record(d).get("engine_pid"))
    except (TypeError, ValueError):
        return None
    return rec


def _client_host(host: Any) -> str:
    """Where a client reaches an engine bound to `host` (as LaunchSpec.base_url says it)."""
    return "127.0.0.1" if host in (None, "0.0.0.0", "::", "") else str(host)


def live_records() -> tuple[dict[str, LiveRecord], dict[str, str]]:
    """Every live record, by model, with its shim (`with_spawned`): the readable ones, and for one that
    cannot be read the record `recovered` from its launch folder. Second: the unreadable files, by model,
    and what is wrong with each."""
    problems = S.unreadable_live()
    out = {m: with_spawned(r) for m, r in S.all_live().items()}
    for model in problems:
        try:
            rec = recovered(model)
        except ServedeckError:  # a file name that is not a model's name: nothing to rebuild it from
            rec = None
        if rec is not None:
            out[model] = rec
    return dict(sorted(out.items())), problems


@dataclass
class Status:
    model: str
    state: str
    record: Optional[LiveRecord]
    desired: bool
    detail: str = ""
    cause: Optional[dict] = None
    evidence: Any = None
    liveness: Optional[dict] = None
    exit: Optional[dict] = None
    asleep_gpu: Optional[dict] = None  # asleep: what it holds per GPU, measured now (NVML by pid)

    def to_json(self) -> dict:
        rec = self.record
        uptime = None
        if rec is not None and rec.ready_t and self.state == LaunchState.READY:
            uptime = round(time.time() - rec.ready_t, 1)
        return {"model": self.model, "state": str(self.state), "desired": self.desired,
                "engine": rec.engine if rec else None, "build": rec.build if rec else None,
                "slot": rec.slot if rec else None, "port": rec.port if rec else None,
                "pid": rec.pid if rec else None, "engine_pid": rec.engine_pid if rec else None, "uptime_s": uptime,
                "started_at": rec.started_at if rec else None, "launch_dir": rec.launch_dir if rec else None,
                "boot": rec.boot if rec else {}, "detail": self.detail, "cause": self.cause,
                "evidence": self.evidence, "liveness": self.liveness,
                "vision": bool(rec.spec.get("vision")) if rec else False,
                "max_output_tokens": rec.spec.get("max_output_tokens") if rec else None,
                "sleep_levels": rec.spec.get("sleep_levels") or [] if rec else [],
                "sleep_level": rec.sleep_level if rec else None,
                "asleep_since": rec.asleep_since if rec else None,
                "asleep_gpu_bytes": (self.asleep_gpu if self.asleep_gpu is not None else rec.asleep_gpu_bytes)
                if rec and rec.state == LaunchState.ASLEEP else {},
                "asleep_host_bytes": rec.asleep_host_bytes if rec else None,
                "wake_check": rec.wake_check if rec else None}


def statuses(ended: dict[str, tuple[LiveRecord, Ending]]) -> list[Status]:
    """What runs, what is wanted, and what ended (`ended`: the launches just settled, shown once as
    crashed/failed/stopped). A query: nothing is written."""
    desired, _ = S.wanted()  # a desired.json that cannot be read hides what is wanted, never what runs
    watch = S.read_watch()
    out: list[Status] = []
    for model, (rec, end) in ended.items():
        out.append(Status(model, end.state, rec, model in desired, end.detail, cause=end.cause, exit=end.exit))
    live, unreadable = live_records()
    for model, problem in unreadable.items():
        if model not in live and model not in ended:
            out.append(Status(model, "unreadable", None, model in desired,
                              f"{problem}; no engine of its launches runs: `{S.stop_command(model)}` sets the file "
                              "aside"))
    for model, rec in live.items():
        if not alive(rec):
            left = left_behind(rec)
            if left:
                out.append(Status(model, "orphaned", rec, model in desired,
                                  f"shim pid {rec.pid} is gone; its engine ({engine_named(rec, left)}) still runs "
                                  f"on port {rec.port}, unsupervised: `servedeck stop {model}` stops it, "
                                  f"`servedeck start {model}` (or the watch loop) replaces it"))
                continue
            end = ending_of(rec)
            out.append(Status(model, end.state, rec, model in desired, end.detail, cause=end.cause,
                              exit=end.exit))
            continue
        state, liveness = str(rec.state), None
        detail = (f"{unreadable[model]}; its engine was found by its launch folder (shim pid {rec.pid}): "
                  f"`servedeck stop {model}` stops it") if model in unreadable else ""
        if rec.state == LaunchState.STARTING and rec.owner_pid and not owner_alive(rec):
            detail = (detail + "; " if detail else "") + (f"the servedeck process that started it (pid {rec.owner_pid}) is gone; "
                      "this engine is not in desired state: `servedeck stop` it or `servedeck start` it again")
        elif rec.state == LaunchState.ASLEEP:
            held = gpu_held(rec) or None  # measured now; the record's figure when there is no GPU to read
            out.append(Status(model, state, rec, model in desired, describe_asleep(rec, held), asleep_gpu=held))
            continue
        elif rec.state == LaunchState.READY:
            ok, why = R.health_ok(rec.probe_spec(), timeout_s=2.0)
            if not ok:
                state, detail = "unhealthy", (detail + "; " if detail else "") + f"health check: {why}"
            else:  # the watch loop's last liveness verdict on this very launch
                seen = watch.get("liveness", {}).get(model) or {}
                if seen.get("launch_dir") == rec.launch_dir and seen.get("verdict") in ("stalled", "slow"):
                    state, liveness = seen["verdict"], seen
                    detail = (detail + "; " if detail else "") + str(seen.get("detail", ""))
        if model not in desired and state in ("ready", "unhealthy"):
            detail = (detail + "; " if detail else "") + "running but not in desired state"
        out.append(Status(model, state, rec, model in desired, detail, liveness=liveness))
    for model in sorted(desired):
        if model in live or model in ended or model in unreadable:
            continue
        gave_up = watch.get("models", {}).get(model) or {}
        if gave_up.get("state") == "gave-up":  # the watch loop stopped relaunching it
            out.append(Status(model, "gave-up", None, True,
                              gave_up.get("detail", "the watch loop gave up relaunching it"),
                              cause=gave_up.get("cause"), evidence=gave_up.get("evidence")))
            continue
        last = next((r for r in reversed(S.read_journal(model)) if r["event"] in ("crash", "start")), None)
        detail, cause = "wanted but not running", None
        if last and last.get("outcome") in ("crashed", "failed"):
            cause = last.get("cause")
            detail += f": last launch {last['outcome']} at {last['ts']} ({last.get('detail', '')})"
        out.append(Status(model, "absent", None, True, detail, cause=cause))
    return out
