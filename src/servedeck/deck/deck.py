"""Deck operations: start, switch, stop, status, restore. The one owner of a launch's state and of
the deck's lock.

A launch's states are `records.LaunchState`; only this module moves a launch between them. Work that
changes the deck runs under its lock: `Deck.start/switch/stop/restore` take it themselves, and other
owners of a loop (watch, soak, campaigns, the front door) do several steps under one hold with

    with deck.locked("watch: reconcile") as ops:     # BusyError when another servedeck holds it
        settled = ops.settle_dead()                  # dead launches recorded as crashed/failed/stopped
        for name, rec in ops.running().items(): ...
        ops.start(name, cfg, reason="relaunch") / ops.stop(name, rec, reason=...) / ops.reap_orphan(...)

`Deck.running()` is a pure query: the live records whose process is alive; it writes nothing.

A shim killed from outside (SIGKILL, the OOM killer) leaves its engine running with nobody to record
its end: `settle_dead` stops such an engine's process group, then settles the launch as crashed
(docs/deck.md says why it stops rather than adopts). `status` shows it as `orphaned` and leaves
it; every operation that changes the deck (start, switch, stop, restore, the watch loop, the door)
settles first, so none of them starts a model over it or reports it "not running".
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from servedeck.config import Build, Config, Deck as DeckConfig, Group, Model
from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.records import LaunchState, LiveRecord, StartResult
from servedeck.deck.slots import Running, decide
from servedeck.engines import get_engine
from servedeck.engines.base import LaunchSpec
from servedeck.errors import BusyError, LaunchError, RefusedError, StateError, UnknownModelError
from servedeck.fsio import atomic_write_json
from servedeck.redact import REDACTED, redact_env, redact_settings_args
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R

def classify(log_tail: str, exit_info: dict | None, when: float | None, engine: str) -> dict:
    """The classified cause of an ending, from the forensic catalogue (doctor/forensics), among the
    signatures that apply to the engine that wrote the log."""
    from servedeck.doctor.forensics import classify as catalogue_classify
    from servedeck.doctor.kernel import events_near

    return catalogue_classify(log_tail, exit_info, events_near(when) if when else [], engine=engine)

def describe_exit(exit_info: dict | None) -> str:
    if not exit_info:
        return "the engine's process group is gone and no exit record was written (killed with its shim?)"
    if exit_info.get("signal"):
        return f"killed by {exit_info['signal']}"
    if exit_info.get("error"):
        return exit_info["error"]
    return f"exited with code {exit_info.get('returncode')}"

# --- settings as desired.json keeps them ---------------------------------------------------

def settings_of(name: str, cfg: Config) -> dict:
    m = cfg.models[name]
    b = cfg.deck.builds[m.build]
    model = m.model_dump(mode="json")
    model["env"] = redact_env(m.env)
    model["args"] = redact_settings_args(model.get("args") or {})
    build = b.model_dump(mode="json")
    build["env"] = redact_env(b.env)
    out = {"model": model, "build_name": m.build, "build": build, "config_path": str(cfg.path),
           "since": S.now_iso()}
    group = cfg.group_of(name)
    if group:  # a relaunch must know its siblings share the slot with it
        out["replica_of"] = {"name": group.name, "members": list(group.members)}
    return out

def config_from_settings(name: str, settings: dict, current: Config | None) -> Config:
    """Rebuild the one-model config a launch was made with; secrets come from the current config or env."""

    def fill(env: dict, current_env: dict, where: str) -> dict:
        out = {}
        for k, v in env.items():
            if v == REDACTED:
                if k in current_env:
                    v = current_env[k]
                elif k in os.environ:
                    v = os.environ[k]
                else:
                    raise StateError(f"desired.json: models.{name}: secret {where}.env.{k} is not stored",
                                     hint=f"set {k} in the environment or in models.toml, then run again")
            out[k] = v
        return out

    def fill_args(args: dict, current_args: dict) -> dict:
        out = {}
        for k, v in args.items():
            if v == REDACTED:
                if k not in current_args:
                    raise StateError(f"desired.json: models.{name}: secret args.{k} is not stored",
                                     hint=f"put args.{k} back in models.toml for models.{name}, then run again")
                v = current_args[k]
            out[k] = v
        return out

    cur_m = current.models.get(name) if current else None
    cur_b = current.deck.builds.get(settings["build_name"]) if current else None
    model = dict(settings["model"])
    build = dict(settings["build"])
    model["env"] = fill(model.get("env", {}), dict(cur_m.env) if cur_m else {}, f"models.{name}")
    model["args"] = fill_args(model.get("args", {}), dict(cur_m.args) if cur_m else {})
    build["env"] = fill(build.get("env", {}), dict(cur_b.env) if cur_b else {}, f"builds.{settings['build_name']}")
    deck = DeckConfig(builds={settings["build_name"]: Build(**build)}, models={name: Model(**model)})
    groups = {}
    if settings.get("replica_of"):
        g = settings["replica_of"]
        m = deck.models[name]
        groups[g["name"]] = Group(g["name"], tuple(g["members"]), (), m.served_name or g["name"], m.slot, None)
    return Config(path=Path(settings.get("config_path", "desired.json")), deck=deck, groups=groups)

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
                "max_output_tokens": rec.spec.get("max_output_tokens") if rec else None}


@dataclass
class Ending:
    """How a launch whose process is gone ended, read from its folder (exit.json, log tail)."""

    state: LaunchState
    exit: Optional[dict]
    cause: Optional[dict]
    tail: str
    left_behind: Optional[dict] = None  # its shim died first: the engine it left, and how the deck stopped it

    @property
    def detail(self) -> str:
        if self.left_behind:
            return self.left_behind["detail"]
        return describe_exit(self.exit)


def ending_of(rec: LiveRecord, left_behind: dict | None = None) -> Ending:
    """Pure but for reading the launch folder: what a dead launch became and why."""
    d = Path(rec.launch_dir)
    exit_info = R.read_exit(d)
    tail = L.log_tail(d, 40)
    state = LaunchState.after_death(rec.state)
    ended = (exit_info or {}).get("ended_at") or time.time()
    cause = classify(tail, exit_info, ended, rec.engine) if state != LaunchState.STOPPED else None
    if left_behind and cause and cause.get("id") == "unknown":  # nothing in the log or the kernel's: say what is known
        cause = {**cause, "id": "supervisor-killed", "family": "supervisor",
                 "summary": "the supervisor shim was killed from outside (a SIGKILL, or the OOM killer)",
                 "action": "if the kernel log shows the OOM killer, give the host more memory or the model less"}
    return Ending(state, exit_info, cause, tail, left_behind)


def alive(rec: LiveRecord) -> bool:
    return P.alive(rec.pid, rec.create_time)


def left_behind(rec: LiveRecord) -> list[int]:
    """The processes of `rec`'s group still running though its shim is gone: its engine, unsupervised.
    The shim's recorded start time guards against a reused pid (supervisor/process.py)."""
    return P.left_in_group(rec.pgid, rec.create_time)


def engine_named(rec: LiveRecord, left: list[int]) -> str:
    """The engine of a launch in words: its own pid (from the live record, or engine.json while it was
    still starting), and how many processes its group still holds when there are more."""
    pid = rec.engine_pid or _read_json(Path(rec.launch_dir) / "engine.json").get("engine_pid")
    if pid not in left:
        pid = left[0] if left else pid
    more = f", {len(left)} processes in its group" if len(left) > 1 else ""
    return f"pid {pid}{more}"


class Deck:
    """Operations on the deck described by one models.toml."""

    def __init__(self, cfg: Config | None):
        self.cfg = cfg

    # --- rendering --------------------------------------------------------------------------
    def render(self, name: str, cfg: Config | None = None) -> LaunchSpec:
        cfg = cfg or self.cfg
        name = cfg.resolve(name)
        engine = get_engine(cfg.deck.builds[cfg.models[name].build].engine)
        return engine.render(name, cfg)

    # --- reality (queries: nothing is written) ----------------------------------------------
    def running(self) -> dict[str, LiveRecord]:
        """Live records whose process is really alive. Dead ones are left for `settle_dead`."""
        return {m: r for m, r in S.all_live().items() if alive(r)}

    # --- the lock ---------------------------------------------------------------------------
    @contextmanager
    def locked(self, what: str, wait_s: float = 0.0) -> Iterator["DeckOps"]:
        """Hold the deck's lock (one start/switch/stop at a time per state dir) and get the operations
        that need it. Raises BusyError, naming the holder, when another servedeck has it."""
        with S.deck_lock(what, wait_s):
            yield DeckOps(self)

    # --- start ------------------------------------------------------------------------------
    def start(self, name: str, *, wait_s: float = 0.0, reason: str = "start",
              evict: Iterable[str] = ()) -> StartResult:
        """Start `name`; refuse when its slot is held. `evict`: models to stop first, by name (the
        explicit way to make room on GPUs held by a model of another slot). A replicated entry
        (replicas = N) starts every replica, one after the other, under one hold of the lock."""
        members = self.cfg.members(name)
        evict = [self._running_name(e) for e in evict]
        with self.locked(f"start {name}", wait_s) as ops:
            ops.settle_dead()
            return ops.start_all(members, self.cfg, reason=reason, evict=evict)

    def _running_name(self, name: str) -> str:
        """A name or alias from models.toml, or the name of a live record (started from another file)."""
        try:
            return self.cfg.resolve(name)
        except UnknownModelError:
            if name in S.all_live():
                return name
            raise

    def switch(self, name: str, *, wait_s: float = 0.0) -> StartResult:
        """Stop whatever holds `name`'s slot, wait until its GPU memory is free, then start `name`
        (every replica of a replicated entry)."""
        members = self.cfg.members(name)
        with self.locked(f"switch {name}", wait_s) as ops:
            ops.settle_dead()
            return ops.start_all(members, self.cfg, reason="switch", evict_slot=True)

    # --- stop -------------------------------------------------------------------------------
    def stop(self, names: list[str] | None, *, wait_s: float = 0.0, grace_s: float | None = None) -> list[dict]:
        """Stop the named models (all running ones when names is None) and drop them from desired state."""
        with self.locked("stop " + (" ".join(names) if names else "--all"), wait_s) as ops:
            # an engine whose shim was killed is stopped here, by its group, and reported as stopped
            settled = {m: end.left_behind for m, (_, end) in ops.settle_dead().items() if end.left_behind}
            running = ops.running()
            targets = [*running, *settled] if names is None else \
                [m for n in names for m in (self.cfg.members(n) if self.cfg else (n,))]
            out = []
            for name in targets:
                S.set_desired(name, None)
                if name in settled:
                    S.journal("stop", name, "stopped", reason="stop", detail=settled[name]["detail"])
                    out.append({"model": name, "outcome": "stopped", "orphaned": True, **settled[name]})
                    continue
                if name not in running:
                    S.journal("stop", name, "not-running")
                    out.append({"model": name, "outcome": "not-running"})
                    continue
                out.append(ops.stop(name, running[name], reason="stop", grace_s=grace_s))
            return out

    # --- status -----------------------------------------------------------------------------
    def status(self) -> list[Status]:
        """What runs, what is wanted, and what ended. Dead launches are settled on the way when the
        lock is free (and shown once as crashed/failed/stopped); when another servedeck holds the lock,
        they are shown as they will be recorded."""
        ended: dict[str, tuple[LiveRecord, Ending]] = {}
        if any(not alive(r) for r in S.all_live().values()):  # take the lock only when there is work for it
            try:
                with self.locked("status: settle dead launches") as ops:
                    ended = ops.settle_dead(stop_left_behind=False)  # a query does not stop a serving engine
            except BusyError:
                pass
        desired = S.read_desired()["models"]
        watch = S.read_watch()
        out: list[Status] = []
        for model, (rec, end) in ended.items():
            out.append(Status(model, end.state, rec, model in desired, end.detail, cause=end.cause, exit=end.exit))
        live = S.all_live()
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
            state, detail, liveness = str(rec.state), "", None
            if rec.state == LaunchState.STARTING and rec.owner_pid and not P.alive(rec.owner_pid):
                detail = (f"the servedeck process that started it (pid {rec.owner_pid}) is gone; "
                          "this engine is not in desired state: `servedeck stop` it or `servedeck start` it again")
            elif rec.state == LaunchState.READY:
                ok, why = R.health_ok(rec.probe_spec(), timeout_s=2.0)
                if not ok:
                    state, detail = "unhealthy", f"health check: {why}"
                else:  # the watch loop's last liveness verdict on this very launch
                    seen = watch.get("liveness", {}).get(model) or {}
                    if seen.get("launch_dir") == rec.launch_dir and seen.get("verdict") in ("stalled", "slow"):
                        state, detail, liveness = seen["verdict"], seen.get("detail", ""), seen
            if model not in desired and state in ("ready", "unhealthy"):
                detail = (detail + "; " if detail else "") + "running but not in desired state"
            out.append(Status(model, state, rec, model in desired, detail, liveness=liveness))
        for model in desired:
            if model in live or model in ended:
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

    # --- restore ----------------------------------------------------------------------------
    def restore(self, *, wait_s: float = 0.0) -> list[dict]:
        """Start what desired state says should run, with the settings it was launched with.
        An engine that is still running is adopted, not started twice."""
        with self.locked("restore", wait_s) as ops:
            ops.settle_dead()
            desired = S.read_desired()["models"]
            running = ops.running()
            out = []
            for name, settings in desired.items():
                if name in running:
                    S.journal("restore", name, "adopted", pid=running[name].pid)
                    out.append({"model": name, "outcome": "adopted", "pid": running[name].pid})
                    continue
                cfg = config_from_settings(name, settings, self.cfg)
                try:
                    res = ops.start(name, cfg, reason="restore")
                    out.append({"model": name, "outcome": "started", "pid": res.record.pid})
                except (LaunchError, RefusedError) as e:
                    out.append({"model": name, "outcome": "failed", "error": e.message})
            return out


class DeckOps:
    """The deck's operations that change state; only `Deck.locked` hands one out, with the lock held."""

    def __init__(self, deck: Deck):
        self.deck = deck

    def running(self) -> dict[str, LiveRecord]:
        return self.deck.running()

    def settle_dead(self, *, stop_left_behind: bool = True) -> dict[str, tuple[LiveRecord, Ending]]:
        """Every live record whose process is gone: say what it died of, keep the evidence (launch.json,
        journal), clear the record. Returns what was settled, by model.

        A shim that died before its engine (killed from outside) left the engine running on the model's
        port: its process group is stopped first (SIGTERM, the model's grace, SIGKILL; then the port and
        the GPUs are waited for), and the ending says so. With `stop_left_behind=False` (status) such a
        launch is left as it is, still recorded live."""
        out = {}
        for model, rec in S.all_live().items():
            if alive(rec):
                continue
            left = left_behind(rec)
            if left and not stop_left_behind:
                continue
            end = ending_of(rec, self._stop_left_behind(rec, left) if left else None)
            L.update_launch(Path(rec.launch_dir), state=end.state.value, ended_at=S.now_iso(), exit=end.exit,
                            cause=end.cause, end_detail=end.detail,
                            **({"left_behind": end.left_behind} if end.left_behind else {}))
            S.clear_live(model)
            if end.state != LaunchState.STOPPED:
                event = "start" if end.state == LaunchState.FAILED else "crash"
                S.journal(event, model, end.state.value, launch_dir=rec.launch_dir, exit=end.exit, cause=end.cause,
                          detail=end.detail, log_tail=end.tail.splitlines()[-10:],
                          **({"left_behind": end.left_behind} if end.left_behind else {}))
            out[model] = (rec, end)
        return out

    def _stop_left_behind(self, rec: LiveRecord, left: list[int]) -> dict:
        """Stop the engine a dead shim left, as `stop` would; what was done, in a sentence and as data."""
        engine = engine_named(rec, left)
        ended = _end_group(rec, rec.stop_timeout_s)
        how = "SIGKILL after grace" if ended.get("killed") else "SIGTERM"
        detail = (f"its supervisor (shim pid {rec.pid}) died and left its engine ({engine}) running "
                  f"unsupervised on port {rec.port}: stopped it ({how}, {ended.get('took_s')} s)")
        if not ended["port_free"]:
            detail += f"; port {rec.port} is still held"
        return {"detail": detail, "pids": left, "shim_pid": rec.pid, **ended}

    # --- start ------------------------------------------------------------------------------
    def start_all(self, members: tuple[str, ...], cfg: Config, *, reason: str, evict_slot: bool = False,
                  evict: Iterable[str] = ()) -> StartResult:
        """Start one model, or every replica of a replicated entry: the first replica evicts what is in
        the way, the others join it. When a replica fails to start, the replicas this call started are
        stopped again (a half-started entry would serve at a fraction of its capacity, unannounced)."""
        if len(members) == 1:
            return self.start(members[0], cfg, reason=reason, evict_slot=evict_slot, evict=evict)
        results: list[StartResult] = []
        try:
            for i, m in enumerate(members):
                results.append(self.start(m, cfg, reason=reason, evict_slot=evict_slot and i == 0,
                                          evict=evict if i == 0 else ()))
        except BaseException:
            for res in results:
                if not res.already_running:
                    self.stop(res.record.model, res.record, reason=f"replica start failed ({reason})")
            raise
        first = results[0]
        return StartResult(first.record, already_running=all(r.already_running for r in results),
                           evicted=first.evicted, waited_for_memory_s=first.waited_for_memory_s,
                           replicas=[r.record for r in results[1:]])

    def start(self, name: str, cfg: Config, *, reason: str, evict_slot: bool = False,
              evict: Iterable[str] = ()) -> StartResult:
        """Start `name` from `cfg`. `evict_slot`: stop whatever holds its slot first (a switch);
        `evict`: stop these models first, whatever their slot."""
        model = cfg.models[name]
        running = self.running()
        for m in [m for m, r in running.items() if is_orphan(r)]:
            # a start/switch that was killed mid-way left this engine booting with no owner: it would
            # otherwise count as "already running" or as a slot holder forever
            self.reap_orphan(m, running.pop(m))
        siblings = cfg.siblings(name)  # replicas of one entry share its slot
        decision = decide(name, model.slot, [Running(m, r.slot, r.port) for m, r in running.items()
                                             if m not in siblings])
        if decision.already_running:
            rec = running[name]
            S.journal(reason, name, "already-running", launch_dir=rec.launch_dir)
            return StartResult(rec, already_running=True)
        named = [e for e in evict if e != name]
        if decision.holders and not evict_slot and not set(decision.holders) <= set(named):
            holders = ", ".join(f"{h} (port {running[h].port}, pid {running[h].pid})" for h in decision.holders)
            S.journal(reason, name, "refused", holders=list(decision.holders))
            raise RefusedError(
                f"cannot start {name}: slot {model.slot!r} is held by {holders}",
                hint=f"`servedeck switch {name}` stops the holder, waits until it is gone, then starts {name}",
            )
        going = list(dict.fromkeys([*(decision.holders if evict_slot else ()), *(n for n in named if n in running)]))
        evicted: list[str] = []
        waited = None
        if going:
            S.journal("switch" if evict_slot else reason, name, "begin", evicting=going)
            for h in going:
                self.stop(h, running[h], reason=f"evicted by {'switch' if evict_slot else reason} to {name}")
                evicted.append(h)
            waited = self._wait_for_memory(name, cfg)
        rec = self._launch(name, cfg, reason=reason)
        if evict_slot:
            S.journal("switch", name, "ok", evicted=evicted, launch_dir=rec.launch_dir, waited_for_memory_s=waited)
        return StartResult(rec, evicted=evicted, waited_for_memory_s=waited)

    @staticmethod
    def _wait_for_memory(name: str, cfg: Config, timeout_s: float = 120.0) -> Optional[float]:
        """After stopping what held the GPUs: the driver frees a process's memory some time after it
        exits. Wait (bounded) until `name` fits; None on a host without a GPU. The launch's own fit
        check then refuses, naming the holder, if it still does not."""
        from servedeck.gpu.fit import wait_for_fit

        def told(report, waited_s: float) -> None:
            if waited_s == 0 or int(waited_s) % 10 == 0:
                S.journal("switch", name, "waiting-for-memory", waited_s=round(waited_s, 2), detail=report.message())

        report, waited = wait_for_fit(cfg, name, timeout_s=timeout_s, on_wait=told)
        return None if report.status == "unknown" else round(waited, 3)

    def _launch(self, name: str, cfg: Config, *, reason: str, settings: dict | None = None) -> LiveRecord:
        from servedeck.gpu.fit import refuse_unless_fits

        spec = self.deck.render(name, cfg)
        model = cfg.models[name]
        holder = P.port_holder(spec.port)
        if holder is not None and not holder.get("pid"):
            # A listener no process owns is a socket still being torn down (an engine killed a moment
            # ago, e.g. before `restore`): give the kernel a few seconds before calling it someone else's.
            P.wait_port_free(spec.port, 5.0)
            holder = P.port_holder(spec.port)
        if holder is not None:
            who = f"pid {holder.get('pid')} ({holder.get('name', '?')}: {holder.get('cmdline', '')[:80]})" \
                if holder.get("pid") else "a process servedeck cannot see"
            S.journal(reason, name, "refused", port=spec.port, holder=holder)
            raise RefusedError(f"cannot start {name}: port {spec.port} is held by {who}",
                               hint="stop that process, or give the model another port in models.toml")
        siblings = cfg.siblings(name)  # a replica's siblings stay: their memory counts
        mates = [m for m, r in self.running().items() if r.slot == model.slot and m not in siblings]
        try:
            refuse_unless_fits(cfg, name, slot_mates=mates)
        except RefusedError as e:
            S.journal(reason, name, "refused", reason="gpu memory", detail=e.message)
            raise
        d = L.new_launch_dir(name)
        lrec = L.write_start(d, spec, model.build, str(cfg.path), reason)
        proc = P.spawn(spec, d)
        build = cfg.deck.builds[model.build]
        live = LiveRecord(model=name, engine=spec.engine, build=model.build, slot=spec.slot, port=spec.port,
                          launch_dir=str(d), pid=proc.pid, pgid=proc.pgid, create_time=proc.create_time,
                          owner_pid=os.getpid(), state=LaunchState.STARTING, host=spec.host,
                          served_name=spec.served_name, base_url=spec.base_url, health_path=spec.health_path,
                          stop_timeout_s=spec.stop_timeout_s, gpus=list(spec.gpus), cpus=list(model.cpus), image=build.image,
                          docker=build.docker, config_path=str(cfg.path), reason=reason,
                          started_at=lrec["started_at"], spec=lrec["spec"])
        S.write_live(live)
        S.journal(reason, name, "spawned", pid=proc.pid, launch_dir=str(d))
        try:
            ready = R.wait_ready(spec, lambda: P.alive(proc.pid, proc.create_time), model.ready_timeout_s)
        except (R.Died, R.TimedOut, KeyboardInterrupt) as e:
            self._failed_start(live, e)
            raise  # _failed_start raises LaunchError for Died/TimedOut; Ctrl-C propagates after cleanup
        boot = get_engine(spec.engine).parse_boot(L.log_tail(d, 4000))
        atomic_write_json(d / "boot.json", boot)
        self._record_plan(name, cfg, boot, d)
        eng = _read_json(d / "engine.json")
        live.state, live.ready_at, live.ready_t = LaunchState.READY, S.now_iso(), time.time()
        live.boot, live.readiness, live.engine_pid = boot, ready.__dict__, eng.get("engine_pid")
        S.write_live(live)
        L.update_launch(d, state=LaunchState.READY.value, ready_at=live.ready_at, readiness=ready.__dict__,
                        engine_pid=live.engine_pid)
        S.set_desired(name, settings or settings_of(name, cfg))
        S.journal(reason, name, "ready", launch_dir=str(d), ready_s=ready.answered_after_s, boot=boot)
        return live

    def _failed_start(self, live: LiveRecord, err: BaseException) -> None:
        d = Path(live.launch_dir)
        timed_out = isinstance(err, R.TimedOut)
        interrupted = isinstance(err, KeyboardInterrupt)
        if timed_out or interrupted:
            P.stop_group(live.pgid, min(live.stop_timeout_s, 30.0))
        else:
            deadline = time.monotonic() + 3.0  # let the shim write exit.json
            while R.read_exit(d) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            P.stop_group(live.pgid, 5.0)  # a dying engine may leave helpers behind
        _cleanup_container(live)
        exit_info = R.read_exit(d)
        tail = L.log_tail(d, 40)
        cause = classify(tail, exit_info, time.time(), live.engine)
        why = "interrupted" if interrupted else str(err) if timed_out else describe_exit(exit_info)
        L.update_launch(d, state=LaunchState.FAILED.value, ended_at=S.now_iso(), exit=exit_info, cause=cause,
                        end_detail=why)
        S.clear_live(live.model)
        S.journal("start", live.model, "failed", launch_dir=str(d), exit=exit_info, cause=cause, detail=why,
                  log_tail=tail.splitlines()[-10:])
        if interrupted:
            return
        raise LaunchError(
            f"{live.model} failed to start: {why}" + (f" — {cause['summary']}" if cause and cause.get("summary") else ""),
            hint=(cause or {}).get("action") or f"read the whole log: `servedeck logs {live.model}`",
            log_tail=L.log_tail(d, 15), cause=cause,
        ) from None

    @staticmethod
    def _record_plan(name: str, cfg: Config, boot: dict, launch_dir: Path) -> None:
        """The planner learns from every boot: engine-reported KV tokens and NVML memory beside its prediction."""
        from servedeck.gpu import record_boot

        try:
            record_boot(name, cfg, boot, launch_dir=str(launch_dir))
        except Exception as e:  # a planner bug must never fail a launch that is up and answering
            S.journal("plan", name, "error", detail=f"{type(e).__name__}: {e}")

    def reap_orphan(self, name: str, rec: LiveRecord) -> dict:
        """Stop an engine left in `starting` by a servedeck process that is gone. Desired state is left
        as it is: the model may still be wanted (the watch loop relaunches it), and was never ready."""
        d = Path(rec.launch_dir)
        result = P.stop_group(rec.pgid, min(rec.stop_timeout_s, 30.0))
        _cleanup_container(rec)
        why = f"orphaned: the servedeck process that started it (pid {rec.owner_pid}) is gone"
        L.update_launch(d, state=LaunchState.FAILED.value, ended_at=S.now_iso(), exit=R.read_exit(d), stop=result,
                        end_detail=why)
        S.clear_live(name)
        S.journal("start", name, "orphan-reaped", launch_dir=str(d), detail=why, killed=result.get("killed"))
        return {"model": name, "outcome": "orphan-reaped", **result}

    # --- stop -------------------------------------------------------------------------------
    def stop(self, name: str, rec: LiveRecord, *, reason: str, grace_s: float | None = None) -> dict:
        """SIGTERM to the group, grace, SIGKILL; then wait until the port is free and NVML lists none of
        the group's pids. Drops the model from desired state."""
        d = Path(rec.launch_dir)
        rec.state = LaunchState.STOPPING
        S.write_live(rec)
        L.update_launch(d, state=LaunchState.STOPPING.value)
        S.set_desired(name, None)
        ended = _end_group(rec, rec.stop_timeout_s if grace_s is None else grace_s)
        result = {k: v for k, v in ended.items() if k not in ("port_free", "gpu_released")}
        exit_info = R.read_exit(d)
        L.update_launch(d, state=LaunchState.STOPPED.value, ended_at=S.now_iso(), exit=exit_info, stop=result,
                        end_detail=f"stopped ({reason})")
        S.clear_live(name)
        S.journal("stop", name, "stopped", reason=reason, launch_dir=str(d), killed=result.get("killed"),
                  took_s=result.get("took_s"), port_free=ended["port_free"], gpu_released=ended["gpu_released"])
        return {"model": name, "outcome": "stopped", **ended}


def _end_group(rec: LiveRecord, grace_s: float) -> dict:
    """SIGTERM to the launch's process group, grace, SIGKILL; its container removed; then wait until
    its port is free and NVML lists none of the group's pids."""
    members = set(P.group_members(rec.pgid))  # before they go: NVML lists them by pid
    result = P.stop_group(rec.pgid, grace_s)
    _cleanup_container(rec)
    return {**result, "port_free": P.wait_port_free(rec.port, 30.0), "gpu_released": _wait_gpu_released(members)}


def _cleanup_container(rec: LiveRecord) -> None:
    """Killing `docker run` does not always remove its container: make sure it is gone."""
    if rec.image:
        import subprocess

        subprocess.run([rec.docker or "docker", "rm", "-f", f"servedeck-{rec.model}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def _wait_gpu_released(pids: set[int], timeout_s: float = 120.0) -> dict | None:
    """On a GPU host, wait until NVML no longer lists any process of the stopped group.

    The driver frees memory after the process is reaped, and not always at once: a switch that
    started the next model earlier would find the card still full. None when there is no GPU.
    """
    from servedeck.gpu import nvml

    t0 = time.monotonic()
    inv = nvml.inventory()
    if not inv.available:
        return None
    while pids & inv.pids():
        if time.monotonic() - t0 > timeout_s:
            return {"released": False, "still_listed": sorted(pids & inv.pids()), "waited_s": timeout_s}
        time.sleep(0.25)
        inv = nvml.inventory()
    return {"released": True, "waited_s": round(time.monotonic() - t0, 3),
            "free_bytes": {g.index: g.memory_free for g in inv.gpus}}


def is_orphan(rec: LiveRecord) -> bool:
    """A launch still `starting` whose servedeck process is gone: nobody will ever finish starting it."""
    owner = rec.owner_pid
    return rec.state == LaunchState.STARTING and bool(owner) and owner != os.getpid() and not P.alive(owner)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
