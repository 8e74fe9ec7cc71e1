"""The watch loop: reconcile desired state with reality on an interval, with a notice for every act.

Each tick:
  1. read desired.json (corrupt → StateError naming the file; the loop reports it once and acts on
     nothing until it is readable again: nothing is started or reaped blindly);
  2. under the deck lock (skipped this tick when a start/switch/stop holds it):
       - settle engines found dead (the deck records the crash and its classified cause; an engine
         whose shim was killed is stopped by the deck first, so the relaunch finds its port free) → notice
       - adopt running engines that desired state wants (a restarted loop starts no duplicate)
       - reap engines nothing wants: not in desired state, or orphaned while `starting`
       - relaunch wanted-but-absent models, give up, or wait, as watch/policy.py decides (try 1 at
         once, then `relaunch_spacing_s` after each failure, up to `relaunch_tries`); a model asleep
         runs, so it is not relaunched, and one that died asleep left desired state (the deck's
         settle_dead: another model holds its slot), so it is not relaunched either
  3. liveness of ready engines: every `liveness_interval_s` a probe (health + 1-token completion,
     `stall_after_s` to answer) runs in a worker thread; verdict changes are notices.

Each wanted model's incident (relaunching, gave-up: watch/policy.py draws them) is kept in watch.json
"models" and survives a loop restart. Decisions are made on the monotonic clock; watch.json keeps
wall-clock epoch seconds, converted when it is read and written.

One loop per state dir (watch.lock, separate from the deck lock). The loop opens no listener.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


from servedeck import paths
from servedeck.config import Config
from servedeck.config.schema import Host
from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.deck import Deck, DeckOps, Ending, config_from_settings, is_orphan
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.engines import get_engine
from servedeck.errors import BusyError, DiskFullError, LaunchError, RefusedError, StateError
from servedeck.fsio import exclusive
from servedeck.supervisor import process as P
from servedeck.watch import policy
from servedeck.watch.liveness import ProbeResult, probe
from servedeck.watch.notices import Notices, Redactor
from servedeck.watch.policy import Incident

TAIL_LINES = 15


def lock_path() -> Path:
    return paths.home() / "watch.lock"


@contextmanager
def watch_lock() -> Iterator[None]:
    """Exactly one loop per state dir. flock is released by the kernel if the loop is killed."""
    def busy(holder: dict | None) -> BusyError:
        who = (f"the watch loop with pid {holder['pid']} (since {holder.get('since')})"
               if holder and "pid" in holder else "another watch loop")
        return BusyError(f"{who} already watches {paths.home()} (lock {lock_path()})",
                         hint="one loop per state dir: stop that one first, or use another SERVEDECK_HOME")

    with exclusive(lock_path(), "watch", busy):
        yield


class Watcher:
    def __init__(self, cfg: Config | None, interval_s: float = 5.0, notices: Notices | None = None):
        self.cfg = cfg
        self.host: Host = cfg.deck.host if cfg else Host()
        self.interval_s = interval_s
        self.deck = Deck(cfg)
        self.notices = notices or Notices(self.host.on_notice, Redactor.from_config(cfg))
        self.redact = self.notices.redactor
        self.policy = policy.Settings.of_host(self.host)
        self.incidents: dict[str, Incident] = {}
        self.liveness: dict[str, dict[str, Any]] = {}
        self._load()
        self.holds_lock = False  # True inside `locked()`
        self.known: set[str] = set()  # models this loop instance has seen running
        self.launched: set[str] = set()  # launch folders this loop instance relaunched
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="liveness")
        self.inflight: dict[str, tuple[str, Future[ProbeResult]]] = {}
        self.last_probe: dict[str, float] = {}
        self.desired_error: str | None = None
        self.state_error: str | None = None  # a full disk: what could not be written, said once
        self.pass_error: str | None = None  # a pass that failed on what it did not foresee, said once

    def _load(self) -> None:
        """What an earlier loop left in watch.json: incidents (a given-up model stays given up) and liveness."""
        doc = S.read_watch()
        offset = _wall_minus_mono()
        self.incidents = {name: Incident.from_json(inc, offset) for name, inc in (doc.get("models") or {}).items()
                          if isinstance(inc, dict)}
        self.liveness = dict(doc.get("liveness") or {})

    def note(self, kind: str, model: str | None, message: str, **detail: Any) -> dict:
        return self.notices.emit(kind, model, message, **detail)

    # --- the loop ------------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[Watcher]:
        """Take the watch lock (BusyError naming the holder if another loop has it) and hold it for
        this watcher until the block ends; `run` inside the block ticks under it. `serve` takes it so
        before its door starts: from its check to the loop's end no other loop can take the state dir."""
        with watch_lock():
            self._load()  # read under the lock: a loop that held it until now may have written it since
            self.holds_lock = True
            try:
                yield self
            finally:
                self.holds_lock = False

    def run(self, stop: threading.Event | None = None, max_ticks: int | None = None) -> None:
        """Tick every `interval_s` until `stop` is set, under the watch lock (taken here unless this
        watcher holds it already, in `locked()`). Sleeps between ticks: never a busy loop."""
        stop = stop or threading.Event()
        if self.holds_lock:
            self._run(stop, max_ticks)
            return
        with self.locked():
            self._run(stop, max_ticks)

    def _run(self, stop: threading.Event, max_ticks: int | None) -> None:
        h = self.host
        self.note("started", None, f"watch loop started (pid {os.getpid()}, every {self.interval_s:g} s; "
                                   f"relaunch {h.relaunch_tries} tries {h.relaunch_spacing_s:g} s apart; "
                                   f"liveness every {h.liveness_interval_s:g} s, stalled after {h.stall_after_s:g} s)")
        ticks = 0
        try:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    self.tick()
                    self._writable()
                except DiskFullError as e:  # the loop keeps watching what runs; it says it cannot record
                    self._unwritable(e)
                except StateError as e:
                    self._desired_unreadable(e)
                except Exception as e:  # noqa: BLE001 - a pass that failed is said and tried again next tick
                    self._pass_failed(e)
                ticks += 1
                if max_ticks is not None and ticks >= max_ticks:
                    break
                stop.wait(max(0.05, self.interval_s - (time.monotonic() - t0)))
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.note("stopped", None, f"watch loop stopped (pid {os.getpid()}); engines keep running")

    def _unwritable(self, e: DiskFullError) -> None:
        if e.message != self.state_error:  # once per distinct problem, not once per tick
            self.state_error = e.message
            text = (f"the state cannot be written: {e.message} — the loop goes on watching what runs and "
                    "acts again once there is room")
            # on stderr too: whoever runs `serve` or `watch` in a terminal sees it there, not in a file
            sys.stderr.write(f"servedeck watch: {text}\n  hint: {e.hint}\n")
            sys.stderr.flush()
            self.note("error", None, text, hint=e.hint)

    def _pass_failed(self, e: Exception) -> None:
        """A pass failed on what it could not foresee (issue 48: the door's descriptors ran out, and
        `OSError: [Errno 24] Too many open files: '…/deck.lock'` ended the loop and the door with it): said
        once per distinct problem, on stderr and as a notice, and the next tick tries again."""
        text = f"a watch pass failed: {type(e).__name__}: {e}"
        if text == self.pass_error:
            return
        self.pass_error = text
        sys.stderr.write(f"servedeck watch: {text} — the loop tries again every {self.interval_s:g} s\n")
        sys.stderr.flush()
        try:
            self.note("error", None, text + " — the loop tries again next tick")
        except Exception:  # noqa: BLE001 - the notice may fail for the same reason (no descriptor): stderr has it
            pass

    def _writable(self) -> None:
        if self.pass_error:
            self.pass_error = None
            self.note("recovered", None, "watch passes succeed again")
        if self.state_error:
            self.state_error = None
            self.note("recovered", None, f"{paths.home()} can be written again")

    def _desired_unreadable(self, e: StateError) -> None:
        if e.message != self.desired_error:  # once per distinct problem, not once per tick
            self.desired_error = e.message
            self.note("error", None, e.message + " — the loop acts on nothing until it is readable", hint=e.hint)

    def tick(self) -> None:
        """One reconcile pass. Raises StateError when desired.json is unreadable (nothing was done)."""
        self._reconcile()
        self._liveness()
        self._save()

    # --- reconcile -----------------------------------------------------------------------------
    def _reconcile(self) -> bool:
        try:
            # Not patient: another holder means a start/switch/stop under way, so look again next tick.
            with self.deck.locked(S.WATCH_TICK, patient=False) as ops:
                # Read under the lock: read before it, a switch that held the lock meanwhile made it stale, and
                # the pass reaped the model the switch had just started (a fresh-clone run, 2026-12-06).
                desired = S.read_desired()["models"]
                if self.desired_error:
                    self.note("recovered", None, f"{paths.desired_file()} is readable again")
                    self.desired_error = None
                for name, (rec, end) in ops.settle_dead().items():  # crash recorded with its cause
                    self._ended(name, rec, end)
                    if rec.state == LaunchState.ASLEEP:  # the deck took it out of desired state: not relaunched
                        desired.pop(name, None)
                running = ops.running()
                for name, rec in list(running.items()):
                    if is_orphan(rec):
                        S.deck_lock_says(f"watch: reap {name}")
                        out = ops.reap_orphan(name, rec)
                        running.pop(name)
                        self.note("reaped", name, f"reaped {name}: left starting by servedeck pid {rec.owner_pid}, "
                                                  "which is gone", pid=rec.pid, killed=out.get("killed"))
                    elif name in desired:
                        self._seen_running(name, rec)
                    elif rec.state == LaunchState.STARTING and rec.owner_pid and P.alive(rec.owner_pid):
                        continue  # a start by a live servedeck process (cannot happen under the lock; kept)
                    else:
                        running.pop(name)
                        S.deck_lock_says(f"watch: reap {name}")  # a stop's grace: longer than a pass is waited through
                        out = ops.stop(name, rec, reason="reaped by watch: not in desired state")
                        self.note("reaped", name, f"reaped {name} (pid {rec.pid}, port {rec.port}): running but "
                                                  "not in desired state", killed=out.get("killed"))
                for name in [n for n in self.incidents if n not in desired]:
                    self.incidents.pop(name)  # unwanted now: nothing to keep trying or reporting
                for name, settings in desired.items():
                    if name not in running:
                        self._absent(ops, name, settings)
            return True
        except BusyError:
            return False  # a start/switch/stop is under way; look again next tick

    def _ended(self, name: str, rec: LiveRecord, end: Ending) -> None:
        self.known.discard(name)
        self.liveness.pop(name, None)
        state = end.state
        if state not in (LaunchState.CRASHED, LaunchState.FAILED):
            return
        cause = end.cause or {}
        tail = L.log_tail(Path(rec.launch_dir), TAIL_LINES).splitlines()
        why = end.detail or str(state)
        if cause.get("summary"):
            why += f" — {cause['summary']}"
        self.note("crashed", name, f"{name} {state}: {why}", launch_dir=rec.launch_dir, exit=end.exit,
                  cause=cause, log_tail=tail, **({"left_behind": end.left_behind} if end.left_behind else {}))
        facts = {"detail": why, "cause": cause, "launch_dir": rec.launch_dir, "log_tail": tail}
        self.incidents[name] = policy.crashed(self.incidents.get(name), str(state), facts, S.now_iso())

    def _seen_running(self, name: str, rec: LiveRecord) -> None:
        if name not in self.known:
            self.known.add(name)
            if rec.launch_dir not in self.launched:
                self.note("adopted", name, f"adopted {name} (pid {rec.pid}, port {rec.port}, {rec.state}): "
                                           "already running, not started again", pid=rec.pid)
        inc, act = policy.running(self.incidents.get(name), self.policy, time.monotonic())
        if inc is None:
            self.incidents.pop(name, None)
        if act.kind == policy.RESUMED:
            self.note("resumed", name, f"{name} runs again (started outside the loop); the loop watches it again")
        elif act.kind == policy.STABLE:
            self.note("stable", name, f"{name} stayed up {self.policy.stable_s:g} s after relaunch; "
                                      "relaunch count reset")

    def _absent(self, ops: DeckOps, name: str, settings: dict) -> None:
        inc = self.incidents.get(name) or Incident(since=S.now_iso())
        inc, act = policy.absent(inc, self.policy, time.monotonic())
        self.incidents[name] = inc
        if act.kind == policy.TELL_ABSENT:
            self.note("absent", name, f"{name} is wanted but not running; relaunch_tries = 0, so the loop leaves it")
        elif act.kind == policy.GIVE_UP:
            self._give_up(name)
        elif act.kind == policy.RELAUNCH:
            self._relaunch(ops, name, settings, act)

    def _relaunch(self, ops: DeckOps, name: str, settings: dict, act: policy.Action) -> None:
        i, n, last = act.attempt, act.of, self.incidents[name].last
        self.note("relaunch", name, f"relaunch {i}/{n} of {name}: {last.get('detail') or 'wanted but not running'}",
                  attempt=i, of=n, cause=last.get("cause"))
        t0 = time.monotonic()
        S.deck_lock_says(f"watch: relaunch {i}/{n} of {name}")  # the whole boot: a caller is told so, not made to wait
        try:
            cfg = config_from_settings(name, settings, self.cfg)
            rec = ops.start(name, cfg, reason="relaunch").record
        except (LaunchError, RefusedError, StateError) as e:
            cause = getattr(e, "cause", None) or {}
            tail = (getattr(e, "log_tail", "") or "").splitlines()
            launch = L.past_launches(name)
            failure = {"outcome": "failed to start", "detail": e.message, "cause": cause,
                       "launch_dir": str(launch[-1]) if launch else None, "log_tail": tail}
            self.incidents[name], then = policy.tried(self.incidents[name], self.policy, time.monotonic(), failure)
            self.note("relaunch-failed", name, f"relaunch {i}/{n} of {name} failed: {e.message}", attempt=i, of=n,
                      cause=cause, log_tail=tail)
            if then.kind == policy.GIVE_UP:
                self._give_up(name)
            return
        self.launched.add(rec.launch_dir)
        self.incidents[name], _ = policy.tried(self.incidents[name], self.policy, time.monotonic())
        self.known.add(name)
        self.note("relaunched", name, f"{name} is back after relaunch {i}/{n}: ready in {time.monotonic() - t0:.1f} s "
                                      f"(pid {rec.pid})", attempt=i, of=n, launch_dir=rec.launch_dir)

    def _give_up(self, name: str) -> None:
        inc = self.incidents[name] = policy.give_up(self.incidents[name], S.now_iso())
        self.note("gave-up", name, f"gave up on {name} after {inc.tries} relaunch tries: {inc.why}. "
                                   f"Evidence: `servedeck status --json`; start it by hand once fixed",
                  cause=inc.cause, evidence=list(inc.evidence))
        S.journal("watch", name, "gave-up", cause=inc.cause, tries=inc.tries, detail=inc.detail)

    # --- liveness ------------------------------------------------------------------------------
    def _liveness(self) -> None:
        for name, (launch_dir, fut) in list(self.inflight.items()):
            if fut.done():
                del self.inflight[name]
                try:
                    self._verdict(name, launch_dir, fut.result())
                except Exception as e:  # a probe bug must not stop the loop; say so
                    self.note("error", name, f"liveness probe of {name} failed: {type(e).__name__}: {e}")
        now = time.monotonic()
        for name, rec in S.all_live().items():
            if rec.state != LaunchState.READY or name in self.inflight:
                continue
            if now - self.last_probe.get(name, -1e9) < self.host.liveness_interval_s:
                continue
            self.last_probe[name] = now
            metrics = get_engine(rec.engine).metrics
            fut = self.pool.submit(probe, rec.probe_spec(), metrics, self.host.stall_after_s)
            self.inflight[name] = (rec.launch_dir, fut)

    def _verdict(self, name: str, launch_dir: str, res: ProbeResult) -> None:
        rec = S.live_or_none(name)
        if not rec or rec.launch_dir != launch_dir:
            return  # the engine probed is gone or replaced; reconcile has spoken about it
        prev = self.liveness.get(name) or {}
        was = prev.get("verdict") if prev.get("launch_dir") == launch_dir else None
        self.liveness[name] = {"verdict": res.verdict, "detail": res.detail, "launch_dir": launch_dir,
                               "at": S.now_iso(), "counters": res.after, "moved": res.moved, "waited_s": res.waited_s,
                               "since": prev.get("since") if was == res.verdict else S.now_iso()}
        if res.verdict == was:
            return
        if res.verdict == "live":
            if was:
                self.note("recovered", name, f"{name} answers again ({res.latency_s} s for a 1-token completion)")
            return
        self.note(res.verdict, name, f"{name} {res.verdict}: {res.detail}", counters=res.after, moved=res.moved,
                  waited_s=res.waited_s, launch_dir=launch_dir)

    def _save(self) -> None:
        offset = _wall_minus_mono()
        incidents = {name: inc.to_json(offset) for name, inc in self.incidents.items()}
        S.write_watch({"pid": os.getpid(), "updated_at": S.now_iso(), "models": self.redact.data(incidents),
                       "liveness": self.redact.data(self.liveness)})


def _wall_minus_mono() -> float:
    """What converts the loop's monotonic times to the epoch seconds watch.json keeps, and back."""
    return time.time() - time.monotonic()
