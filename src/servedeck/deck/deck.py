"""Deck operations: start, switch, stop, status, restore. The one owner of a launch's state and of
the deck's lock.

A launch's states are `records.LaunchState`; only this module moves a launch between them. Work that
changes the deck runs under its lock: `Deck.start/switch/stop/restore` take it themselves, and other
owners of a loop (watch, soak, campaigns, the front door) do several steps under one hold with

    with deck.locked(S.WATCH_TICK, patient=False) as ops:  # BusyError when another servedeck holds it
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

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from servedeck import paths
from servedeck.config import Config
from servedeck.config.schema import Build
from servedeck.deck import launch as L
from servedeck.deck import sleep as Z
from servedeck.deck import sleepops as SO
from servedeck.deck import state as S
from servedeck.deck.desired import config_from_settings, settings_diff, settings_of
from servedeck.deck.docker import remove_container
from servedeck.deck.memwait import wait_for_memory, wait_gpu_released
from servedeck.deck.records import LaunchState, LiveRecord, StartResult
from servedeck.deck.slots import Running, decide
from servedeck.deck.status import (Ending, Status, alive, classify, describe_exit, engine_named, engine_record,
                                   ending_of, footprint_of, is_orphan, left_behind, live_records, statuses,
                                   with_spawned)
from servedeck.engines import get_engine
from servedeck.engines.base import Engine, LaunchSpec
from servedeck.errors import BusyError, DiskFullError, LaunchError, RefusedError, StateError, UnknownModelError
from servedeck.fsio import atomic_write_json, free_bytes, human
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R

KILL_GRACE_S = 10.0  # a Ctrl-C or cell_timeout does not wait a model's whole stop grace (120 s by default)

# Names other rooms import from here (watch, soak, the door, campaigns): the deck's public surface.
__all__ = ["Deck", "DeckOps", "Ending", "Status", "alive", "classify", "config_from_settings", "describe_exit",
           "ending_of", "footprint_of", "is_orphan", "settings_of"]


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
        """Live records whose process is really alive. Dead ones are left for `settle_dead`. A record
        written before its spawn comes with its shim's pid when one was spawned (`with_spawned`)."""
        return {m: r for m, r in live_records()[0].items() if alive(r)}

    # --- the lock ---------------------------------------------------------------------------
    @contextmanager
    def locked(self, what: str, wait_s: float = 0.0, patient: bool = True) -> Iterator["DeckOps"]:
        """Hold the deck's lock (one start/switch/stop at a time per state dir) and get the operations
        that need it. Raises BusyError, naming the holder, when another servedeck has it (`state.deck_lock`
        says how long it waits first, and `patient`)."""
        with S.deck_lock(what, wait_s, patient):
            yield DeckOps(self)

    # --- start ------------------------------------------------------------------------------
    def start(self, name: str, *, wait_s: float = 0.0, reason: str = "start",
              evict: Iterable[str] = (), on_step: Z.Step | None = None) -> StartResult:
        """Start `name`; refuse when its slot is held. `evict`: models to stop first, by name (the
        explicit way to make room on GPUs held by a model of another slot). A replicated entry
        (replicas = N) starts every replica, one after the other, under one hold of the lock. A model
        asleep is woken rather than started. `on_step(word)` is told what each phase is (the door's
        x-servedeck-waited words)."""
        members = self.cfg.members(name)
        evict = [self._running_name(e) for e in evict]
        with self.locked(f"start {name}", wait_s) as ops:
            ops.settle_dead()
            return ops.start_all(members, self.cfg, reason=reason, evict=evict, on_step=on_step)

    def _running_name(self, name: str) -> str:
        """A name or alias from models.toml, or the name of a live record (started from another file)."""
        try:
            return self.cfg.resolve(name)
        except UnknownModelError:
            if name in S.all_live() or name in S.unreadable_live():
                return name
            raise

    def switch(self, name: str, *, wait_s: float = 0.0, on_step: Z.Step | None = None) -> StartResult:
        """Move whatever holds `name`'s slot out of the way (put to sleep where its entry and the host
        allow, else stopped), wait until its GPU memory is free, then wake `name` if it sleeps or start it
        (every replica of a replicated entry)."""
        members = self.cfg.members(name)
        with self.locked(f"switch {name}", wait_s) as ops:
            ops.settle_dead()
            return ops.start_all(members, self.cfg, reason="switch", evict_slot=True, on_step=on_step)

    # --- sleep ------------------------------------------------------------------------------
    def sleep(self, name: str, *, level: int | None = None, wait_s: float = 0.0, reason: str = "sleep") -> list[dict]:
        """Put a ready model (every replica of an entry) to sleep: at `level`, or at the one the host
        allows (deck/sleeping.py). Refused, never stopped, when it cannot sleep."""
        members = self.cfg.members(name)
        with self.locked(f"sleep {name}", wait_s) as ops:
            ops.settle_dead()
            return [SO.sleep_named(ops, m, self.cfg, level, reason) for m in members]

    def wake(self, name: str, *, wait_s: float = 0.0, on_step: Z.Step | None = None) -> StartResult:
        """Wake a sleeping model (every replica of an entry); refused when it does not sleep, or when an
        awake model holds its slot (`switch` moves that one out of the way)."""
        members = self.cfg.members(name)
        with self.locked(f"wake {name}", wait_s) as ops:
            ops.settle_dead()
            running = ops.running()
            for m in members:
                rec = running.get(m)
                if rec is None or rec.state != LaunchState.ASLEEP:
                    now = "not running" if rec is None else str(rec.state)
                    raise RefusedError(f"cannot wake {m}: it is {now}, not asleep",
                                       hint=f"`servedeck start {name}` starts it" if rec is None else
                                       f"`servedeck status` shows {m}")
            return ops.start_all(members, self.cfg, reason="wake", on_step=on_step)

    # --- stop -------------------------------------------------------------------------------
    def stop(self, names: list[str] | None, *, wait_s: float = 0.0, grace_s: float | None = None) -> list[dict]:
        """Stop the named models (all running ones when names is None) and drop them from desired state.
        Nothing it reads or writes first can stop a stop: a desired.json that cannot be read or written,
        or a live record that cannot be read (its engine is found by its launch folder, the file set
        aside), is said in the row's `warnings`."""
        with self.locked("stop " + (" ".join(names) if names else "--all"), wait_s) as ops:
            # an engine whose shim was killed is stopped here, by its group, and reported as stopped; on a
            # full disk its records may not be written: said, and the stop goes on
            first: list[str] = []
            ended = _noted(first, ops.settle_dead) or {}
            settled = {m: end.left_behind for m, (_, end) in ended.items() if end.left_behind}
            running = ops.running()
            wanted, unreadable_desired = S.wanted()
            unreadable = S.unreadable_live()
            # --all is "want nothing": a model wanted but not running (the watch loop gave up on it) goes too,
            # and so does a live record nobody can read
            targets = list(dict.fromkeys([*running, *settled, *sorted(wanted), *unreadable])) if names is None else \
                [m for n in names for m in (self.cfg.members(n) if self.cfg else (paths.component(n),))]
            out = []
            for name in targets:
                # ops.stop drops a running model from desired state itself; a desired.json that cannot be read
                # is not tried again for each model
                drop = None if name in running else \
                    (f"{name} could not be taken out of desired state: {unreadable_desired}" if unreadable_desired
                     else S.drop_desired(name))
                warnings = [*first, *([drop] if drop else [])]
                if name in settled:
                    _noted(warnings, lambda: S.journal("stop", name, "stopped", reason="stop",
                                                       detail=settled[name]["detail"]))
                    out.append({"model": name, "outcome": "stopped", "orphaned": True, **settled[name],
                                "warnings": warnings})
                    continue
                if name not in running:
                    # by the file found in live/ (its name may be one no models.toml could give)
                    aside = S.set_aside(paths.live_dir() / f"{name}.json") if name in unreadable else None
                    if aside:
                        warnings.append(f"{unreadable[name]}; no engine of its launches runs: set aside as {aside}")
                    _noted(warnings, lambda: S.journal("stop", name, "not-running", was_wanted=name in wanted,
                                                       **({"set_aside": str(aside)} if aside else {})))
                    out.append({"model": name, "outcome": "not-running", "was_wanted": name in wanted,
                                "set_aside": str(aside) if aside else None, "warnings": warnings})
                    continue
                res = ops.stop(name, running[name], reason="stop", grace_s=grace_s)
                res["warnings"] = warnings + res.get("warnings", [])
                out.append(res)
            return out

    # --- stop at once, from outside ---------------------------------------------------------
    def kill(self, names: Iterable[str], *, reason: str) -> list[str]:
        """Stop these models' engines now, without the deck's lock: a Ctrl-C or a cell_timeout, from outside
        a thread that may hold the lock for a whole boot. A record that is up (ready, asleep) is marked
        `stopping` first, so whoever settles it next under the lock (a stop, start or status) records a
        stop, not a crash; its group then gets SIGTERM, at most KILL_GRACE_S, SIGKILL, and the journal
        says why. A model mid-start is stopped unmarked: its start fails and says so. Returns those stopped."""
        out = []
        for name in names:
            rec = S.read_live(name)
            if rec is None or not alive(rec):
                continue
            if rec.state in (LaunchState.READY, LaunchState.ASLEEP):
                _mark_stopping(rec, [])
            ended = _end_group(rec, min(rec.stop_timeout_s, KILL_GRACE_S))
            _noted([], lambda: S.journal("stop", name, "stopped", reason=reason, launch_dir=rec.launch_dir,
                                         killed=ended.get("killed"), took_s=ended.get("took_s"), lockless=True))
            out.append(name)
        return out

    # --- status -----------------------------------------------------------------------------
    def status(self) -> list[Status]:
        """What runs, what is wanted, and what ended. Dead launches are settled on the way when the
        lock is free (and shown once as crashed/failed/stopped); when another servedeck holds the lock,
        they are shown as they will be recorded."""
        ended: dict[str, tuple[LiveRecord, Ending]] = {}
        if any(not alive(r) for r in live_records()[0].values()):  # take the lock only when there is work for it
            try:
                with self.locked("status: settle dead launches", patient=False) as ops:  # a query: no wait
                    ended = ops.settle_dead(stop_left_behind=False)  # a query does not stop a serving engine
            except BusyError:
                pass
        return statuses(ended)

    # --- restore ----------------------------------------------------------------------------
    def restore(self, *, wait_s: float = 0.0, from_config: bool = False) -> list[dict]:
        """Start what desired state says should run, with the settings it was launched with (seed 004's
        trap: a wrong first launch repeats itself), or with models.toml's own when `from_config`. Each
        row says which it started and where models.toml now differs (`desired.settings_diff`). An engine
        that is still running is adopted, not started twice."""
        with self.locked("restore" + (" --from-config" if from_config else ""), wait_s) as ops:
            ops.settle_dead()
            desired = S.read_desired()["models"]
            running = ops.running()
            out = []
            for name, settings in desired.items():
                differs = settings_diff(name, settings, self.cfg)
                row = {"model": name, "differs": differs}
                if name in running:
                    S.journal("restore", name, "adopted", pid=running[name].pid)
                    out.append({**row, "outcome": "adopted", "pid": running[name].pid, "from": "running"})
                    continue
                if settings.get("asleep"):  # its slot went to another model: started cold, it would be refused
                    S.set_desired(name, None)
                    why = (f"it was asleep (level {settings['asleep']}) when its engine went; not restored: its "
                           "next request at the door, or `servedeck start`, starts it cold")
                    S.journal("restore", name, "not-restored", detail=why)
                    out.append({**row, "outcome": "not restored", "error": why})
                    continue
                in_config = self.cfg is not None and name in self.cfg.models
                if from_config and not in_config:
                    out.append({**row, "outcome": "skipped", "from": None,
                                "error": f"not in {self.cfg.path if self.cfg else 'models.toml'}: nothing to start "
                                         f"it from (`servedeck stop {name}` stops wanting it)"})
                    continue
                source = "models.toml" if from_config else "desired.json"
                try:
                    cfg = self.cfg if from_config else config_from_settings(name, settings, self.cfg)
                    res = ops.start(name, cfg, reason="restore")
                    out.append({**row, "outcome": "started", "pid": res.record.pid, "from": source})
                except (LaunchError, RefusedError, StateError) as e:
                    out.append({**row, "outcome": "failed", "from": source, "error": e.message})
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
        for model, rec in live_records()[0].items():  # an unreadable record: as rebuilt from its launch folder
            if alive(rec):
                continue
            left = left_behind(rec)
            if left and not stop_left_behind:
                continue
            end = ending_of(rec, self._stop_left_behind(rec, left) if left else None)
            remove_container(rec)  # the `docker run` client died: its container may not have
            what = L.crash_identity(Path(rec.launch_dir), rec.build)
            L.update_launch(Path(rec.launch_dir), state=end.state.value, ended_at=S.now_iso(), exit=end.exit,
                            cause=end.cause, end_detail=end.detail, **what,
                            **({"left_behind": end.left_behind} if end.left_behind else {}))
            S.clear_live(model)
            if end.state != LaunchState.STOPPED:
                event = "start" if end.state == LaunchState.FAILED else "crash"
                S.journal(event, model, end.state.value, launch_dir=rec.launch_dir, exit=end.exit, cause=end.cause,
                          detail=end.detail, log_tail=end.tail.splitlines()[-10:], was=rec.state.value, **what,
                          **({"left_behind": end.left_behind} if end.left_behind else {}))
            if rec.state == LaunchState.ASLEEP:
                # Not relaunched: another model holds its slot, so a cold start would be refused (the
                # watch loop would retry it into a give-up). Its next request starts it.
                S.set_desired(model, None)
                S.journal("crash", model, "not-wanted", launch_dir=rec.launch_dir,
                          detail="it died asleep: out of desired state; the door or `servedeck start` starts it cold")
            out[model] = (rec, end)
        return out

    def _stop_left_behind(self, rec: LiveRecord, left: list[int]) -> dict:
        """Stop the engine a dead shim left, as `stop` would; what was done, in a sentence and as data."""
        engine = engine_named(rec, left)
        exit_info = R.read_exit(Path(rec.launch_dir))
        ended = _end_group(rec, rec.stop_timeout_s)
        how = "SIGKILL after grace" if ended.get("killed") else "SIGTERM"
        if exit_info:  # the shim saw its engine end and exited itself: what is left are the engine's stragglers
            detail = (f"its engine ended ({describe_exit(exit_info)}) and left {len(left)} process(es) of its group "
                      f"running (pids {', '.join(map(str, left[:5]))}): stopped them ({how}, {ended.get('took_s')} s)")
        else:
            detail = (f"its supervisor (shim pid {rec.pid}) died and left its engine ({engine}) running "
                      f"unsupervised on port {rec.port}: stopped it ({how}, {ended.get('took_s')} s)")
        if not ended["port_free"]:
            detail += f"; port {rec.port} is still held"
        return {"detail": detail, "pids": left, "shim_pid": rec.pid, **ended}

    # --- start ------------------------------------------------------------------------------
    def start_all(self, members: tuple[str, ...], cfg: Config, *, reason: str, evict_slot: bool = False,
                  evict: Iterable[str] = (), on_step: Z.Step | None = None) -> StartResult:
        """Start one model, or every replica of a replicated entry: the first replica evicts what is in
        the way, the others join it. When a replica fails to start, the replicas this call started are
        stopped again (a half-started entry would serve at a fraction of its capacity, unannounced)."""
        if len(members) == 1:
            return self.start(members[0], cfg, reason=reason, evict_slot=evict_slot, evict=evict, on_step=on_step)
        results: list[StartResult] = []
        try:
            for i, m in enumerate(members):
                results.append(self.start(m, cfg, reason=reason, evict_slot=evict_slot and i == 0,
                                          evict=evict if i == 0 else (), on_step=on_step))
        except BaseException:
            for res in results:
                if not res.already_running:
                    self.stop(res.record.model, res.record, reason=f"replica start failed ({reason})")
            raise
        first = results[0]
        return StartResult(first.record, already_running=all(r.already_running for r in results),
                           evicted=first.evicted, waited_for_memory_s=first.waited_for_memory_s,
                           replicas=[r.record for r in results[1:]], slept=first.slept,
                           stopped_cold=first.stopped_cold, woke=first.woke)

    def start(self, name: str, cfg: Config, *, reason: str, evict_slot: bool = False,
              evict: Iterable[str] = (), on_step: Z.Step | None = None) -> StartResult:
        """Start `name` from `cfg`, or wake it when it sleeps. `evict_slot`: move whatever holds its slot
        out of the way first (a switch: each holder put to sleep where it can, else stopped); `evict`:
        stop these models first, whatever their slot. A model asleep holds no slot."""
        model = cfg.models[name]
        on_step = SO.once_each(on_step)
        running = self.running()
        for m in [m for m, r in running.items() if is_orphan(r)]:
            # a start/switch that was killed mid-way left this engine booting with no owner: it would
            # otherwise count as "already running" or as a slot holder forever
            self.reap_orphan(m, running.pop(m))
        siblings = cfg.siblings(name)  # replicas of one entry share its slot
        target = running.get(name)
        asleep = target is not None and target.state == LaunchState.ASLEEP
        awake = [Running(m, r.slot, r.port) for m, r in running.items()
                 if m not in siblings and r.state != LaunchState.ASLEEP]
        decision = decide(name, model.slot, awake)
        if decision.already_running:
            S.journal(reason, name, "already-running", launch_dir=target.launch_dir)
            return StartResult(target, already_running=True)
        named = [e for e in evict if e != name]
        if decision.holders and not evict_slot and not set(decision.holders) <= set(named):
            holders = ", ".join(f"{h} (port {running[h].port}, pid {running[h].pid})" for h in decision.holders)
            S.journal(reason, name, "refused", holders=list(decision.holders))
            raise RefusedError(
                f"cannot {'wake' if asleep else 'start'} {name}: slot {model.slot!r} is held by {holders}",
                hint=f"`servedeck switch {name}` moves the holder out of the way (asleep where it can sleep, "
                     f"else stopped), then {'wakes' if asleep else 'starts'} {name}",
            )
        slot_holders = list(decision.holders) if evict_slot else []
        going = [n for n in named if n in running and n not in slot_holders]
        evicted: list[str] = []
        slept: dict[str, dict] = {}
        cold: dict[str, str] = {}
        waited = None
        if slot_holders or going:
            self._refuse_before_evicting(name, cfg, [*slot_holders, *going], running, reason)
            S.journal("switch" if evict_slot else reason, name, "begin", evicting=[*slot_holders, *going])
            evicted, slept, cold = SO.evict(self, name, slot_holders, running, cfg, on_step)
            for h in going:
                SO.tell(on_step, "switch")
                self.stop(h, running[h], reason=f"evicted by {reason} to {name}")
                evicted.append(h)
        if asleep:
            res = SO.wake(self, name, target, cfg, reason, on_step)
            res.evicted, res.slept, res.stopped_cold = evicted, slept, cold
        else:
            if evicted:
                # the boot is the rest of the switch: under the cold word when a holder could not sleep
                SO.tell(on_step, next(iter(cold.values()), None) and f"switch (cold: {next(iter(cold.values()))})"
                        or "switch")
                SO.make_room(self, name, cfg)
                waited = wait_for_memory(name, cfg)
            else:
                SO.tell(on_step, "start")
                SO.make_room(self, name, cfg)
            res = StartResult(self._launch(name, cfg, reason=reason), evicted=evicted, waited_for_memory_s=waited,
                              slept=slept, stopped_cold=cold)
        if evict_slot:
            S.journal("switch", name, "ok", evicted=evicted, launch_dir=res.record.launch_dir, waited_for_memory_s=waited,
                      slept=slept, stopped_cold=cold, woke=res.woke)
        return res

    def _refuse_before_evicting(self, name: str, cfg: Config, leaving: list[str], running: dict[str, LiveRecord],
                                reason: str) -> None:
        """What would refuse `name`'s start once its holders are gone is asked before they go: the state
        dir's free space (min_free_mib) and whether it fits in GPU memory with the holders' and the sleepers'
        memory counted as freed (the plan is checked there too). Names and ports were checked when
        models.toml was read. Before issue 48 a switch on a full state disk stopped the holder and then
        refused the target, and nothing ran until space was freed."""
        from servedeck.gpu.fit import fit_now

        kept = ", ".join(leaving)
        try:
            _require_room(name, cfg)
            asleep = [m for m, r in running.items() if r.state == LaunchState.ASLEEP and m != name]
            report = fit_now(cfg, name, releasing=[*leaving, *asleep])
            if not report.ok:
                raise report.refusal([*leaving])
        except (DiskFullError, RefusedError) as e:
            S.journal(reason, name, "refused", reason="before evicting", detail=e.message, kept=leaving)
            e.message = f"{e.message.removesuffix('; nothing was started')}; {kept} left running, nothing was stopped"
            raise
    def _launch(self, name: str, cfg: Config, *, reason: str, settings: dict | None = None) -> LiveRecord:
        from servedeck.doctor.build import build_version
        from servedeck.gpu import inventory
        from servedeck.gpu.fit import refuse_unless_fits
        from servedeck.gpu.modelplan import model_gpus

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
        inv = inventory()
        try:
            refuse_unless_fits(cfg, name, slot_mates=mates, inv=inv)
        except RefusedError as e:
            S.journal(reason, name, "refused", reason="gpu memory", detail=e.message)
            raise
        _require_room(name, cfg)
        build = cfg.deck.builds[model.build]
        engine = get_engine(spec.engine)
        # what a crash record must say it was a crash of (the build's version: the engine may die before
        # it says its own), and the GPUs' PCI addresses, by which a kernel Xid names the card it is about
        version, version_source = build_version(build, cfg)
        pci = {str(i): inv.gpu(i).pci_bus_id for i in model_gpus(model, engine, inv)
               if inv.available and inv.gpu(i) is not None and inv.gpu(i).pci_bus_id}
        d = L.new_launch_dir(name)  # a servedeck killed from here to the live record leaves only this folder
        entry = {k: v for k, v in settings_of(name, cfg).items() if k != "since"}
        lrec = L.write_start(d, spec, model.build, str(cfg.path), reason, entry=entry, engine_version=version,
                             engine_version_source=version_source, gpus_pci=pci or None)
        # Recorded before the spawn, pid not yet known: a servedeck killed at any point of the spawn
        # leaves a record whose owner is gone, and the next one reaps the shim it finds by the launch
        # folder (status.with_spawned), or settles the start as cut short when none was spawned.
        live = LiveRecord(model=name, engine=spec.engine, build=model.build, slot=spec.slot, port=spec.port,
                          launch_dir=str(d), pid=None, pgid=None, create_time=None, owner_pid=os.getpid(),
                          owner_create_time=P.start_time_of(os.getpid()), state=LaunchState.STARTING, host=spec.host,
                          served_name=spec.served_name, base_url=spec.base_url, health_path=spec.health_path,
                          stop_timeout_s=spec.stop_timeout_s, gpus=list(spec.gpus), cpus=list(model.cpus), image=build.image,
                          docker=build.docker, config_path=str(cfg.path), reason=reason,
                          started_at=lrec["started_at"], spec=lrec["spec"])
        S.write_live(live)
        try:
            proc = P.spawn(spec, d)
            live.pid, live.pgid, live.create_time = proc.pid, proc.pgid, proc.create_time
            S.write_live(live)
            S.journal(reason, name, "spawned", pid=proc.pid, launch_dir=str(d))
        except BaseException as e:  # a Ctrl-C in here included: the shim, if spawned, is stopped by its folder
            self._spawn_failed(live, e)
            raise
        try:
            ready = R.wait_ready(spec, lambda: P.alive(proc.pid, proc.create_time), model.ready_timeout_s)
        except (R.Died, R.TimedOut, KeyboardInterrupt) as e:
            self._failed_start(live, e, build)
            raise  # _failed_start raises LaunchError for Died/TimedOut; Ctrl-C propagates after cleanup
        try:
            boot = engine.parse_boot(L.log_tail(d, 4000))
            atomic_write_json(d / "boot.json", boot)
            _engine_said(d, engine, build, boot.get("engine_version"))
            self._record_plan(name, cfg, boot, d)
            eng = engine_record(d)
            live.state, live.ready_at, live.ready_t = LaunchState.READY, S.now_iso(), time.time()
            live.boot, live.readiness, live.engine_pid = boot, ready.__dict__, eng.get("engine_pid")
            S.write_live(live)
            L.update_launch(d, state=LaunchState.READY.value, ready_at=live.ready_at, readiness=ready.__dict__,
                            engine_pid=live.engine_pid)
            S.set_desired(name, settings or settings_of(name, cfg))
        except (StateError, OSError) as e:  # up and answering, but not recorded: it must not run unowned
            raise self._unrecorded(live, e) from None
        S.journal(reason, name, "ready", launch_dir=str(d), ready_s=ready.answered_after_s, boot=boot)
        if spec.sleep_levels:  # what the first wake's answers are compared with (deck/sleep.py)
            Z.take_reference(live)
        return live

    def _unrecorded(self, live: LiveRecord, err: BaseException) -> StateError:
        """The engine is ready but its state could not be written (a full disk, desired.json unreadable):
        stop it again rather than leave an engine nobody recorded, record what still can be, and say so."""
        P.stop_group(live.pgid, min(live.stop_timeout_s, 30.0), leader_create_time=live.create_time)
        remove_container(live)
        why = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
        for write in (lambda: L.update_launch(Path(live.launch_dir), state=LaunchState.FAILED.value,
                                              ended_at=S.now_iso(), end_detail=f"stopped again: {why}"),
                      lambda: S.journal("start", live.model, "failed", launch_dir=live.launch_dir, detail=why)):
            try:
                write()
            except (StateError, OSError):
                pass  # the disk that refused the record refuses these too; the error below says it
        S.clear_live(live.model)
        msg = f"{live.model} was up but could not be recorded, so it was stopped again: {why}"
        if isinstance(err, DiskFullError):
            return DiskFullError(msg, hint=err.hint, path=err.path, free_bytes=err.free_bytes)
        if isinstance(err, StateError):
            return StateError(msg, hint=err.hint)
        return StateError(msg, hint="fix what the message names, then start it again")

    def _spawn_failed(self, live: LiveRecord, err: BaseException) -> None:
        """The spawn, or recording it, raised (the interpreter cannot be executed, a Ctrl-C): stop the
        shim if it was spawned all the same, record the start failed, clear the record written for it."""
        d = Path(live.launch_dir)
        shim = P.find_shim(d)
        if shim is not None:
            P.stop_group(shim.pgid, 5.0, leader_create_time=shim.create_time)
        why = "interrupted" if isinstance(err, KeyboardInterrupt) else \
            f"could not spawn its supervisor: {type(err).__name__}: {err}"
        what = L.crash_identity(d, live.build)
        L.update_launch(d, state=LaunchState.FAILED.value, ended_at=S.now_iso(), end_detail=why, **what)
        S.clear_live(live.model)
        S.journal("start", live.model, "failed", launch_dir=str(d), detail=why, **what)

    def _failed_start(self, live: LiveRecord, err: BaseException, build: Build | None = None) -> None:
        d = Path(live.launch_dir)
        timed_out = isinstance(err, R.TimedOut)
        interrupted = isinstance(err, KeyboardInterrupt)
        if timed_out or interrupted:
            P.stop_group(live.pgid, min(live.stop_timeout_s, 30.0), leader_create_time=live.create_time)
        else:
            R.wait_exit(d, 3.0)  # let the shim write exit.json
            P.stop_group(live.pgid, 5.0, leader_create_time=live.create_time)  # a dying engine may leave helpers behind
        remove_container(live)
        exit_info = R.read_exit(d)
        tail = L.log_tail(d, 40)
        log = L.log_for_causes(d)
        mine = footprint_of(d, live.image, live.pid, engine_record(d).get("engine_pid"))
        cause = classify(log, exit_info, time.time(), live.engine, mine)
        engine = get_engine(live.engine)
        _engine_said(d, engine, build, engine.parse_boot(log).get("engine_version"))
        what = L.crash_identity(d, live.build)
        why = "interrupted" if interrupted else str(err) if timed_out else describe_exit(exit_info, d)
        L.update_launch(d, state=LaunchState.FAILED.value, ended_at=S.now_iso(), exit=exit_info, cause=cause,
                        end_detail=why, **what)
        S.clear_live(live.model)
        S.journal("start", live.model, "failed", launch_dir=str(d), exit=exit_info, cause=cause, detail=why,
                  log_tail=tail.splitlines()[-10:], **what)
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
        stored = S.read_live(name)
        rec = with_spawned(rec)
        result = P.stop_group(rec.pgid, min(rec.stop_timeout_s, 30.0), leader_create_time=rec.create_time)
        remove_container(rec)
        why = f"orphaned: the servedeck process that started it (pid {rec.owner_pid}) is gone"
        if stored is not None and stored.pid is None:
            why += f" before recording its shim's pid (the shim, pid {rec.pid}, was found by its launch folder)"
        what = L.crash_identity(d, rec.build)
        L.update_launch(d, state=LaunchState.FAILED.value, ended_at=S.now_iso(), exit=R.read_exit(d), stop=result,
                        end_detail=why, **what)
        S.clear_live(name)
        S.journal("start", name, "orphan-reaped", launch_dir=str(d), detail=why, killed=result.get("killed"), **what)
        return {"model": name, "outcome": "orphan-reaped", **result}

    # --- stop -------------------------------------------------------------------------------
    def stop(self, name: str, rec: LiveRecord, *, reason: str, grace_s: float | None = None) -> dict:
        """SIGTERM to the group, grace, SIGKILL; then wait until the port is free and NVML lists none of
        the group's pids. Drops the model from desired state."""
        d = Path(rec.launch_dir)
        warnings: list[str] = []
        _mark_stopping(rec, warnings)
        drop = S.drop_desired(name)
        if drop:
            warnings.append(drop)
        ended = _end_group(rec, rec.stop_timeout_s if grace_s is None else grace_s)
        result = {k: v for k, v in ended.items() if k not in ("port_free", "gpu_released")}
        exit_info = R.read_exit(d)
        _noted(warnings, lambda: L.update_launch(d, state=LaunchState.STOPPED.value, ended_at=S.now_iso(),
                                                 exit=exit_info, stop=result, end_detail=f"stopped ({reason})"))
        S.clear_live(name)  # an unlink: needs no room
        _noted(warnings, lambda: S.journal("stop", name, "stopped", reason=reason, launch_dir=str(d),
                                           killed=result.get("killed"), took_s=result.get("took_s"),
                                           port_free=ended["port_free"], gpu_released=ended["gpu_released"]))
        return {"model": name, "outcome": "stopped", **ended, "warnings": list(dict.fromkeys(warnings))}


def _mark_stopping(rec: LiveRecord, warnings: list[str]) -> None:
    """The mark a stop makes before it signals the group: whoever finds the process gone settles it as
    stopped, not crashed. Nothing written here is needed to stop the engine: a full disk or a damaged file
    is said in `warnings`, and the group is stopped whatever was written."""
    rec.state = LaunchState.STOPPING
    aside = _noted(warnings, lambda: S.write_live(rec))  # an unreadable record it replaces is set aside first
    if aside:
        warnings.append(f"its live record could not be read; set aside as {aside}")
    _noted(warnings, lambda: L.update_launch(Path(rec.launch_dir), state=LaunchState.STOPPING.value))


def _noted(warnings: list[str], write: Callable[[], Any]) -> Any:
    """`write()`, or None with what went wrong added to `warnings` (a full disk, a file it cannot read):
    for the records a stop keeps, which must never keep it from stopping."""
    try:
        out, note = S.with_reserve(write)  # a full disk: the room kept for this, once
        if note:
            warnings.append(note)
        return out
    except StateError as e:
        warnings.append(e.message)
    except OSError as e:
        warnings.append(f"{getattr(e, 'filename', None) or 'a state file'}: {e.strerror or e}")
    return None


def _require_room(name: str, cfg: Config) -> None:
    """Refuse a launch into a state dir with less free than [host] min_free_mib: its engine's log and its
    records are written while it runs, and a start that cannot write them would leave an engine no one
    recorded (seed: 40 KB free, boot.json failed, the engine ran on)."""
    need = cfg.deck.host.min_free_mib * 2**20
    free = free_bytes(paths.home())
    if need and free is not None and free < need:
        raise DiskFullError(f"cannot start {name}: {paths.home()} has {human(free)} free, less than "
                            f"[host] min_free_mib ({cfg.deck.host.min_free_mib:g} MiB); nothing was started",
                            hint=f"free space on the disk that holds {paths.home()} (engine logs are in its "
                                 "launches/ folder); `servedeck stop` works meanwhile",
                            path=str(paths.home()), free_bytes=free)
    S.keep_reserve()


def _engine_said(d: Path, engine: Engine, build: Build | None, stated: str | None) -> None:
    """The engine's own word on its version (its boot log), through its adapter (llama.cpp from the sdist
    says b0), replaces the build's in launch.json; nothing said, the build's stays."""
    said = engine.version(build, stated) if stated else None
    if said:
        L.update_launch(d, engine_version=said, engine_version_source="the engine's boot log"
                        if said == stated else "the boot log, read by its adapter")


def _end_group(rec: LiveRecord, grace_s: float) -> dict:
    """SIGTERM to the launch's process group, grace, SIGKILL; its container removed; then wait until
    its port is free and NVML lists none of the group's pids."""
    # before they go: NVML lists them by pid
    members = set(P.members_if_ours(rec.pgid, rec.create_time))
    result = P.stop_group(rec.pgid, grace_s, leader_create_time=rec.create_time)
    remove_container(rec)
    return {**result, "port_free": P.wait_port_free(rec.port, 30.0), "gpu_released": wait_gpu_released(members)}
