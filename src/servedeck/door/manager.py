"""The front door's model manager: per-model door state, queues, in-flight counts, and the effects
the swap policy (policy.py) decides on. It is the one owner of the door states listed there.

Everything here runs on the door's event loop except the deck calls, which block (a boot takes
seconds to minutes) and so run in worker threads (`asyncio.to_thread`): streams of other models
keep flowing while one model boots. The deck's lock is the deck's: the manager only calls the
public `Deck.start`, `Deck.switch` and `Deck.stop`, each with a bounded wait for the lock.

One task per slot (`_slot_worker`) serialises the boots and switches of that slot; it exists
while some request waits for a model of the slot. A sync task reads the live records every
second so that what the CLI, the watch loop or a crash did is seen; a ttl task puts idle models to
sleep (ttl_sleep) and unloads them (ttl). While a deck call runs, the deck says what each phase is
(`on_step`: sleep, wake, switch, cold restart): the words waiting requests report in x-servedeck-waited.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from servedeck.config import Config
from servedeck.deck import state as S
from servedeck.deck.deck import Deck, alive, ending_of
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.door import policy as Pol
from servedeck.door.checks import quoted
from servedeck.door.metrics import DoorMetrics
from servedeck.engines import get_engine
from servedeck.errors import BusyError, DoorError, LaunchError, RefusedError, ServedeckError
from servedeck.supervisor import process as P

DECK_LOCK_WAIT_S = 120.0  # a deck call waits this long for the lock (the watch loop or a CLI command holds it)
REFUSED_RETRY_S = 10.0  # a start refused for memory or port: new requests get 503 for this long
STREAM_END_WAIT_S = 3.0  # a broken stream: how long to wait for its engine's shim to record how it ended
ENGINE_STILL_UP_S = 0.5  # ... and how long an engine still running is given to be found dying after all


@dataclass
class Refusal(DoorError):
    """An answer other than the model's own: status, message, and when to come back."""

    status: int
    message: str
    hint: str | None = None
    retry_after_s: float | None = None
    cause: dict | None = None
    until: float | None = None  # monotonic: the refusal stands for new requests until then

    def __str__(self) -> str:
        return self.message


@dataclass
class ModelRuntime:
    name: str
    slot: str
    served_name: str
    aliases: list[str]
    ttl_s: float | None = None
    ttl_sleep_s: float | None = None  # put to sleep after this long without requests
    managed: bool = True  # False: an outside server given by --upstream; never started or stopped
    # models.toml's `embeddings`: True answers /v1/embeddings only, False everything else; None (an
    # --upstream server) unknown, everything is sent
    embeddings: bool | None = None
    chat_logprobs: bool = False  # its engine's completion logprobs come in the chat shape (door/logprobs.py)
    context: int | None = None  # models.toml's `context`: the most a request's max_tokens may ask (door/checks.py)
    state: str = Pol.STOPPED
    inflight: int = 0
    queued: int = 0
    ready_since: float | None = None
    last_request: float | None = None
    want_since: float | None = None  # when the oldest waiting request arrived (slot worker order)
    replicas: list[Pol.Replica] = field(default_factory=list)
    refusal: Refusal | None = None
    attempts_done: int = 0
    last_error: tuple[int, Refusal] | None = None
    busy: bool = False  # a deck call for it (start/switch/stop) is under way
    port: int | None = None
    detail: str = ""
    members: tuple[str, ...] = ()  # the deck's models behind this name: itself, or a replicated entry's replicas
    waiting_for: str = ""  # why its waiting requests wait now (a policy WHY_ word; set by the slot worker)
    records: dict[str, LiveRecord] = field(default_factory=dict)  # replica url → the launch behind it
    sleep_refused: str | None = None  # ttl_sleep was refused for this launch (why): not asked again until it restarts
    policy: Pol.ReplicaPolicy = field(default_factory=Pol.replica_policy)  # which replica takes a request

    def view(self) -> Pol.View:
        retry = self.refusal.until if self.refusal else None
        return Pol.View(self.name, self.slot, self.state, self.inflight, self.queued, self.ready_since,
                        self.last_request, retry)


class Manager:
    def __init__(self, cfg: Config | None, metrics: DoorMetrics, *, external: dict[str, list[str]] | None = None,
                 external_routing: dict[str, str] | None = None, notify: Callable[..., Any] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.deck = Deck(cfg)
        self.metrics = metrics
        self.clock = clock
        self.notify = notify or (lambda *a, **k: None)
        self.on_launched: Callable[[dict], None] = lambda rec: None  # serve: tells the watch loop it was us
        host = cfg.deck.host if cfg else None
        self.settings = Pol.Settings(min_residency_s=host.min_residency_s if host else 30.0,
                                     drain_timeout_s=host.drain_timeout_s if host else 120.0)
        self.queue_max = host.queue_max if host else 64
        self.request_wait_s = host.request_wait_s if host else 900.0
        self.retry_spacing_s = host.relaunch_spacing_s if host else 60.0
        self.models: dict[str, ModelRuntime] = {}
        self.names: dict[str, str] = {}  # name, alias or served name → model
        for name, m in (cfg.models.items() if cfg else []):
            if cfg.group_of(name):
                continue  # a replica is served under its entry's name (below)
            self.models[name] = ModelRuntime(name, m.slot, m.served_name or name, list(m.aliases), m.ttl,
                                             m.ttl_sleep, port=m.port, members=(name,))
        for g in (cfg.groups.values() if cfg else []):
            self.models[g.name] = ModelRuntime(g.name, g.slot, g.served_name, list(g.aliases), g.ttl,
                                               g.ttl_sleep, members=g.members)
        for name, urls in (external or {}).items():
            self.models[name] = ModelRuntime(name, f"external:{name}", name, [], managed=False, state=Pol.READY,
                                             ready_since=clock(), replicas=[Pol.Replica(u.rstrip("/")) for u in urls])
            self.models[name].policy = Pol.replica_policy((external_routing or {}).get(name))
        for rt in self.models.values():
            if cfg and rt.members:  # models.toml's `routing` and `embeddings` (a replica carries its entry's)
                rt.policy = Pol.replica_policy(**cfg.models[rt.members[0]].routing.model_dump())
                m = cfg.models[rt.members[0]]
                rt.embeddings = m.embeddings
                rt.context = m.context
                rt.chat_logprobs = get_engine(cfg.deck.builds[m.build].engine).completion_logprobs_chat_shaped
            for n in (rt.name, rt.served_name, *rt.aliases):
                self.names.setdefault(n, rt.name)
        self.cond = asyncio.Condition()
        self.workers: dict[str, asyncio.Task] = {}
        self.tasks: list[asyncio.Task] = []
        self.swaps: deque[dict] = deque(maxlen=50)

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self, preload: list[str] = ()) -> None:
        await self.sync()
        self.tasks.append(asyncio.create_task(self._sync_loop(), name="door-sync"))
        self.tasks.append(asyncio.create_task(self._ttl_loop(), name="door-ttl"))
        for name in preload:
            self.tasks.append(asyncio.create_task(self._preload(self.resolve(name))))

    async def close(self) -> None:
        for t in [*self.tasks, *self.workers.values()]:
            t.cancel()
        await asyncio.gather(*self.tasks, *self.workers.values(), return_exceptions=True)

    async def _preload(self, name: str) -> None:
        try:
            rep = await self.acquire(name)
            self.release(name, rep)
        except Refusal as r:
            self.notify("door-preload-failed", name, f"preload of {name} failed: {r.message}")

    def resolve(self, name: str) -> str:
        try:
            return self.names[name]
        except KeyError:
            known = ", ".join(sorted(self.names)) or "(none)"
            raise Refusal(404, f"no model or alias named {quoted(name)} (known: {known})",
                          hint="GET /v1/models lists every model and alias") from None

    # --- requests -----------------------------------------------------------------------------------
    async def acquire(self, name: str, waited: Pol.Waited | None = None, ask: Pol.Ask | None = None) -> Pol.Replica:
        """A replica of `name` to send one request to, starting or switching the model first when
        needed. Raises Refusal (429 queue full, 502 failed boot, 503 cannot start now, 504 waited too long).
        `waited` is told, at every look, why the request still waits (its x-servedeck-waited header);
        `ask` is what the model's replica policy may read of the request."""
        rt = self.models[name]
        now = self.clock()
        rt.last_request = now
        async with self.cond:
            if rt.state == Pol.READY:
                return self._take(rt, ask)
            if rt.refusal and rt.refusal.until and now < rt.refusal.until:
                raise self._with_retry(rt.refusal, now)
            if rt.queued >= self.queue_max:
                raise Refusal(429, f"{name}: {rt.queued} requests already wait for it to start "
                                   f"(queue_max {self.queue_max})", retry_after_s=5,
                              hint="retry later, or raise [host] queue_max")
            rt.queued += 1
            mark = rt.attempts_done
            if rt.want_since is None:
                rt.want_since = now
            self._gauge(rt)
            self._ensure_worker(rt.slot)
            self.cond.notify_all()
            deadline = now + self.request_wait_s
            try:
                while True:
                    if waited is not None:
                        waited.note(self.clock(), rt.waiting_for)
                    if rt.state == Pol.READY:
                        return self._take(rt, ask)
                    if rt.last_error and rt.last_error[0] > mark:
                        raise self._with_retry(rt.last_error[1], self.clock())
                    left = deadline - self.clock()
                    if left <= 0:
                        raise Refusal(504, f"{name} did not become ready within request_wait "
                                           f"({self.request_wait_s:g} s); state: {rt.state} {rt.detail}".strip(),
                                      retry_after_s=10)
                    try:
                        await asyncio.wait_for(self.cond.wait(), left)
                    except asyncio.TimeoutError:
                        pass
            finally:
                rt.queued -= 1
                if rt.queued == 0:
                    rt.want_since = None
                    rt.waiting_for = ""
                    if rt.slot in self.workers:  # the slot worker waits for a holder's waiters (policy: handover)
                        self.cond.notify_all()
                self._gauge(rt)

    def take_ready(self, name: str, ask: Pol.Ask | None = None) -> Pol.Replica | None:
        """A replica of `name` when it is ready now (no waiting, no task); None otherwise: then
        `acquire` waits for it."""
        rt = self.models[name]
        if rt.state != Pol.READY:
            return None
        rt.last_request = self.clock()
        return self._take(rt, ask)

    def _with_retry(self, r: Refusal, now: float) -> Refusal:
        left = (r.until - now) if r.until else r.retry_after_s
        return Refusal(r.status, r.message, r.hint, max(1.0, round(left or 1.0)), r.cause, r.until)

    def _take(self, rt: ModelRuntime, ask: Pol.Ask | None) -> Pol.Replica:
        rep = rt.policy.pick(ask, rt.replicas)
        rep.outstanding += 1
        rep.sent += 1
        rt.inflight += 1
        self.metrics.of(rt.name).inflight.set(rt.inflight)
        return rep

    def release(self, name: str, rep: Pol.Replica) -> None:
        rt = self.models[name]
        rep.outstanding -= 1
        rt.inflight -= 1
        rt.last_request = self.clock()
        self.metrics.of(rt.name).inflight.set(rt.inflight)
        if rt.inflight == 0 and (rt.state == Pol.DRAINING or rt.slot in self.workers):
            self._wake()  # a drain, or a wait on the residency of a holder in use, may end now

    def _wake(self) -> None:
        async def poke() -> None:
            async with self.cond:
                self.cond.notify_all()

        asyncio.get_running_loop().create_task(poke())

    def _gauge(self, rt: ModelRuntime) -> None:
        m = self.metrics.of(rt.name)
        m.inflight.set(rt.inflight)
        m.queue.set(rt.queued)

    def _set_state(self, rt: ModelRuntime, state: str, detail: str = "") -> None:
        if state == Pol.READY and rt.state != Pol.READY:
            rt.ready_since = self.clock()
            rt.waiting_for = ""
        rt.state, rt.detail = state, detail
        self.metrics.set_state(rt.name, state)

    # --- the slot worker: boots and switches, one at a time per slot ---------------------------------
    def _ensure_worker(self, slot: str) -> None:
        w = self.workers.get(slot)
        if w is None or w.done():
            self.workers[slot] = asyncio.create_task(self._slot_worker(slot), name=f"door-slot-{slot}")

    async def _slot_worker(self, slot: str) -> None:
        drain_started: float | None = None
        while True:
            async with self.cond:
                wanting = [rt for rt in self.models.values()
                           if rt.slot == slot and rt.queued > 0 and rt.state != Pol.READY and rt.managed]
                if not wanting:
                    for rt in self.models.values():  # a drain nobody waits for any more is called off
                        if rt.slot == slot and rt.state == Pol.DRAINING:
                            self._set_state(rt, Pol.READY)
                    self.workers.pop(slot, None)
                    self.cond.notify_all()
                    return
                target = min(wanting, key=lambda r: r.want_since or 0.0)
                now = self.clock()
                act = Pol.decide(target.name, {n: r.view() for n, r in self.models.items()}, now, self.settings,
                                 drain_started)
                for rt in wanting:  # the others wait for the target's turn in the slot
                    self._waiting(rt, act.why if rt is target else Pol.WHY_SLOT)
                if act.kind in ("wait", "drain", "fail", "serve"):
                    if act.kind == "drain":
                        drain_started = drain_started if drain_started is not None else now
                        for n in act.evict:
                            if self.models[n].state == Pol.READY:
                                self._set_state(self.models[n], Pol.DRAINING, f"switching to {target.name}")
                        self.cond.notify_all()
                    target.detail = act.reason
                    if act.kind == "fail" and target.refusal:  # waiters get the standing refusal
                        target.attempts_done += 1
                        target.last_error = (target.attempts_done, target.refusal)
                        self.cond.notify_all()
                    timeout = max(0.05, min((act.until - now) if act.until else 1.0, 1.0))
                    try:
                        await asyncio.wait_for(self.cond.wait(), timeout)
                    except asyncio.TimeoutError:
                        pass
                    continue
                # start or switch: from here the deck owns the transition
                drain_started = None
                target.busy = True
                self._set_state(target, Pol.STARTING, act.reason)
                for n in act.evict:
                    self.models[n].busy = True
                    self._set_state(self.models[n], Pol.STOPPING, f"evicted by a switch to {target.name}")
                self.cond.notify_all()
            await self._boot(target, act)

    def _waiting(self, rt: ModelRuntime, why: str) -> None:
        """Say why `rt`'s requests wait now; they look (and count the time so far) when it changes."""
        if why and why != rt.waiting_for:
            rt.waiting_for = why
            self.cond.notify_all()

    def _told(self, rt: ModelRuntime) -> Callable[[str], None]:
        """What the deck, in its worker thread, calls with the word for each phase of a boot or switch
        (sleep, wake, switch, cold restart): waiting requests then count the time so far and go on under it."""
        loop = asyncio.get_running_loop()

        async def phase(word: str) -> None:
            async with self.cond:
                rt.detail = word
                self._waiting(rt, word)

        def told(word: str) -> None:
            asyncio.run_coroutine_threadsafe(phase(word), loop)

        return told

    async def _boot(self, target: ModelRuntime, act: Pol.Action) -> None:
        t0 = self.clock()
        evict = list(act.evict)
        kind = "switch" if evict else "wake" if act.kind == "wake" else "start"
        self.notify(f"door-{kind}", target.name, f"{kind} to {target.name}" +
                    (f", evicting {', '.join(evict)}" if evict else "") + f" ({act.reason})")
        err: Refusal | None = None
        recs: list[LiveRecord] = []
        res = None
        told = self._told(target)
        try:
            if evict:
                res = await asyncio.to_thread(self.deck.switch, target.name, wait_s=DECK_LOCK_WAIT_S, on_step=told)
            else:
                res = await asyncio.to_thread(self.deck.start, target.name, wait_s=DECK_LOCK_WAIT_S, reason="door",
                                              on_step=told)
            recs = res.records
        except LaunchError as e:
            cause = e.cause or {}
            err = Refusal(502, e.message, e.hint, self.retry_spacing_s, cause, self.clock() + self.retry_spacing_s)
        except RefusedError as e:
            err = Refusal(503, e.message, e.hint, REFUSED_RETRY_S, None, self.clock() + REFUSED_RETRY_S)
        except BusyError as e:
            err = Refusal(503, e.message, e.hint, 5.0, None, None)
        except ServedeckError as e:
            err = Refusal(503, e.message, e.hint, REFUSED_RETRY_S, None, self.clock() + REFUSED_RETRY_S)
        except Exception as e:  # a bug must reach the waiting clients as an answer, not hang them
            err = Refusal(500, f"starting {target.name} failed: {type(e).__name__}: {e}", None, 5.0)
        took = self.clock() - t0
        live = await asyncio.to_thread(self._read_live)
        async with self.cond:
            target.busy = False
            for n in evict:
                self.models[n].busy = False
                self._set_state(self.models[n], Pol.STOPPED)
            target.attempts_done += 1
            self._apply_live(live)
            if err is None and recs:
                for rec in recs:
                    self.on_launched(rec)
                self._set_state(target, Pol.READY)
                self._upstream_from(target, recs)
                target.refusal = None
                self.metrics.boots.labels(target.name, "ok").inc()
                if evict:
                    self.metrics.swaps.labels(target.name, "ok").inc()
                    self.metrics.swap_seconds.labels(target.name).observe(took)
                how = _how(res)
                self.swaps.append({"model": target.name, "kind": kind, "evicted": evict, "took_s": round(took, 3),
                                   "at": S.now_iso(), "outcome": "ok", "slept": res.slept,
                                   "stopped_cold": res.stopped_cold, "woke": _woke_brief(res.woke)})
                target.sleep_refused = None
                self.notify(f"door-{kind}-ok", target.name, f"{target.name} ready after {took:.1f} s ({kind}"
                            + (f"; {how}" if how else "") + ")", took_s=round(took, 3), evicted=evict,
                            slept=res.slept, stopped_cold=res.stopped_cold, woke=_woke_brief(res.woke))
            else:
                assert err is not None
                target.refusal = err if err.until else None
                target.last_error = (target.attempts_done, err)
                if target.state != Pol.READY:
                    self._set_state(target, Pol.FAILED if err.status == 502 else Pol.STOPPED, err.message)
                outcome = "failed" if err.status == 502 else "refused"
                self.metrics.boots.labels(target.name, outcome).inc()
                if evict:
                    self.metrics.swaps.labels(target.name, outcome).inc()
                self.swaps.append({"model": target.name, "kind": kind, "evicted": evict, "took_s": round(took, 3),
                                   "at": S.now_iso(), "outcome": outcome, "error": err.message})
                self.notify(f"door-{kind}-{outcome}", target.name, err.message, status=err.status, cause=err.cause)
            self.cond.notify_all()

    def why_stream_broke(self, name: str, url: str, what: str) -> tuple[str, dict | None]:
        """Why the server at `url` broke off a response of `name`'s, as a message and the classified
        cause where there is one. Blocking (a short wait for the process to be gone, then the launch
        folder's exit record and log tail): run in a thread. An engine that exited is described by the
        deck (how it ended, doctor's catalogue); one that still runs, or an outside server, by what
        the connection did."""
        rt = self.models.get(name)
        rec = rt.records.get(url) if rt else None
        if rec is None:
            return f"{name} at {url} broke off the response: {what}", None
        # The kernel closes a dying process's sockets just before it is reaped, and the shim writes
        # how its engine ended just after: look for a moment, not for a whole relaunch's worth.
        def engine_up() -> bool:
            return P.alive(rec.engine_pid) if rec.engine_pid else alive(rec)

        if still_up_after_a_break(engine_up, lambda: alive(rec)):
            return f"{name} at {url} broke off the response ({what}); its engine is still running", None
        end = ending_of(rec)
        cause = end.cause or {}
        summary = cause.get("summary")
        msg = f"{name}'s engine exited mid-stream: {end.detail}" + (f"; classified cause: {summary}" if summary else "")
        brief = {k: cause[k] for k in ("id", "family", "summary", "action", "matched_line", "source", "exit")
                 if k in cause}
        return msg, brief or None

    # --- what really runs -----------------------------------------------------------------------------
    def _read_live(self) -> dict[str, LiveRecord]:
        """Live records whose process is alive (a query: settling the dead is the deck's and the loop's)."""
        return self.deck.running()

    def _upstream_from(self, rt: ModelRuntime, recs: list[LiveRecord]) -> None:
        """Send `rt`'s requests to these ready servers (one, or a replicated entry's ready replicas);
        a replica already known keeps its outstanding count."""
        urls = []
        for rec in recs:
            url = (rec.base_url or f"http://{rec.host}:{rec.port}").rstrip("/")
            urls.append(url[:-3] if url.endswith("/v1") else url)
        if [r.url for r in rt.replicas] != urls:
            known = {r.url: r for r in rt.replicas}
            rt.replicas = [known.get(u) or Pol.Replica(u) for u in urls]
        rt.records = dict(zip(urls, recs))
        rt.port = recs[0].port
        rt.served_name = recs[0].served_name or rt.served_name

    def _apply_live(self, live: dict[str, LiveRecord]) -> bool:
        """Bring door states in line with the live records, except where a deck call of ours is under way.
        A replicated entry is ready while any replica is (requests go to the ready ones; the watch loop
        relaunches a replica that died)."""
        changed = False
        for rt in self.models.values():
            if not rt.managed or rt.busy:
                continue
            recs = [live[m] for m in rt.members if m in live]
            ready = [r for r in recs if r.state == LaunchState.READY]
            if not recs:
                if rt.state in (Pol.READY, Pol.DRAINING, Pol.STARTING, Pol.STOPPING):
                    self._set_state(rt, Pol.STOPPED, "not running")
                    changed = True
            elif ready:
                self._upstream_from(rt, ready)
                if rt.state not in (Pol.READY, Pol.DRAINING):
                    self._set_state(rt, Pol.READY)
                    rt.refusal = None
                    changed = True
            elif all(r.state == LaunchState.ASLEEP for r in recs):
                if rt.state != Pol.ASLEEP:
                    level = recs[0].sleep_level
                    self._set_state(rt, Pol.ASLEEP, f"asleep (level {level})")
                    changed = True
            else:
                rec = recs[0]
                if rec.state in (LaunchState.STARTING, LaunchState.STOPPING) and rt.state != rec.state.value:
                    self._set_state(rt, rec.state.value, f"{rec.state.value} outside the door")
                    changed = True
        return changed

    async def sync(self) -> None:
        live = await asyncio.to_thread(self._read_live)
        async with self.cond:
            if self._apply_live(live):
                self.cond.notify_all()

    async def _sync_loop(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.sync()
            except Exception as e:  # a torn file must not end the door
                self.notify("error", None, f"door sync failed: {type(e).__name__}: {e}")

    # --- ttl -------------------------------------------------------------------------------------------
    async def _ttl_loop(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            now = self.clock()
            for rt in list(self.models.values()):
                if not rt.managed or rt.busy:
                    continue
                if Pol.idle_expired(rt.view(), rt.ttl_s, now):
                    await self._unload(rt, f"idle for ttl ({rt.ttl_s:g} s)")
                elif rt.sleep_refused is None and Pol.sleep_due(rt.view(), rt.ttl_sleep_s, now):
                    await self._sleep_idle(rt, f"idle for ttl_sleep ({rt.ttl_sleep_s:g} s)")

    async def _sleep_idle(self, rt: ModelRuntime, why: str) -> None:
        """ttl_sleep: put an idle model to sleep (every replica), at the level the host allows. A refusal
        (it cannot sleep, or host memory is short for its only level) is said once; ttl still stops it."""
        async with self.cond:
            if rt.busy or rt.inflight or rt.queued or rt.state != Pol.READY:
                return
            rt.busy = True
            self._set_state(rt, Pol.STOPPING, f"going to sleep: {why}")
        try:
            results = await asyncio.to_thread(self.deck.sleep, rt.name, wait_s=DECK_LOCK_WAIT_S, reason="ttl_sleep")
            self.metrics.ttl_sleeps.labels(rt.name).inc()
            levels = ", ".join(f"{r['model']} {r.get('outcome')}" + (f" at level {r['level']}" if r.get("level") else "")
                               for r in results)
            self.notify("door-sleep", rt.name, f"{rt.name} put to sleep: {why} ({levels})", results=results)
        except ServedeckError as e:
            rt.sleep_refused = e.message
            self.notify("door-sleep-refused", rt.name, f"could not put {rt.name} to sleep ({why}): {e.message}")
        finally:
            live = await asyncio.to_thread(self._read_live)
            async with self.cond:
                rt.busy = False
                if rt.state == Pol.STOPPING:
                    self._set_state(rt, Pol.STOPPED, why)  # corrected from the live records just below
                self._apply_live(live)
                self.cond.notify_all()

    async def _unload(self, rt: ModelRuntime, why: str) -> None:
        async with self.cond:
            if rt.busy or rt.inflight or rt.queued or rt.state not in (Pol.READY, Pol.ASLEEP):
                return
            rt.busy = True
            self._set_state(rt, Pol.STOPPING, why)
        try:
            await asyncio.to_thread(self.deck.stop, [rt.name], wait_s=DECK_LOCK_WAIT_S)
            self.metrics.unloads.labels(rt.name).inc()
            self.notify("door-unload", rt.name, f"stopped {rt.name}: {why}")
        except ServedeckError as e:
            self.notify("door-unload-failed", rt.name, f"could not stop {rt.name} ({why}): {e.message}")
        finally:
            live = await asyncio.to_thread(self._read_live)
            async with self.cond:
                rt.busy = False
                if not any(m in live for m in rt.members):
                    self._set_state(rt, Pol.STOPPED, why)
                self._apply_live(live)
                self.cond.notify_all()

    # --- reading --------------------------------------------------------------------------------------
    def snapshot(self) -> list[dict]:
        now = self.clock()
        out = []
        for rt in self.models.values():
            out.append({"model": rt.name, "aliases": rt.aliases, "served_name": rt.served_name, "slot": rt.slot,
                        "state": rt.state, "detail": rt.detail, "inflight": rt.inflight, "queued": rt.queued,
                        "port": rt.port, "managed": rt.managed, "ttl_s": rt.ttl_s, "ttl_sleep_s": rt.ttl_sleep_s,
                        "members": list(rt.members) if len(rt.members) > 1 else None,
                        "ready_for_s": round(now - rt.ready_since, 1) if rt.state == Pol.READY and rt.ready_since else None,
                        "replicas": [{"url": r.url, "outstanding": r.outstanding} for r in rt.replicas],
                        "refusal": {"status": rt.refusal.status, "message": rt.refusal.message} if rt.refusal else None})
        return out


def still_up_after_a_break(engine_up: Callable[[], bool], shim_up: Callable[[], bool], *,
                           clock: Callable[[], float] = time.monotonic,
                           sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether a server that broke off a stream is still running, once it has had a moment to be found dying.

    An engine still up is given ENGINE_STILL_UP_S to be seen gone after all: its socket closes before the
    kernel marks it exited, and on a loaded box that gap is long. An engine gone, with its shim still up, is
    waited for up to STREAM_END_WAIT_S, until the shim has written how it ended and exited. Until
    2026-12-05 the wait ended as soon as the shim was gone, so when the whole process group was SIGKILLed
    the engine had no moment at all, and one stream in three was told "its engine is still running"."""
    t0 = clock()
    while clock() - t0 < STREAM_END_WAIT_S:
        up = engine_up()
        if up and clock() - t0 >= ENGINE_STILL_UP_S:
            return True
        if not up and not shim_up():
            return False
        sleep(0.05)
    return engine_up()


def _woke_brief(woke: dict | None) -> dict | None:
    """What a wake did, for the door's swap list: level, time, the first wake's verdict, a cold restart."""
    if not woke:
        return None
    check = woke.get("check") or {}
    return {"level": woke.get("level"), "took_s": woke.get("took_s"), "check": check.get("verdict"),
            **({"cold_restart": woke["cold_restart"]} if woke.get("cold_restart") else {})}


def _how(res: Any) -> str:
    """`smol asleep at level 1; woken from level 1`: what a switch did with the holder and the target."""
    if res is None:
        return ""
    parts = [f"{m} asleep at level {w['level']}" for m, w in (res.slept or {}).items()]
    parts += [f"{m} stopped cold: {why}" for m, why in (res.stopped_cold or {}).items()]
    woke = res.woke or {}
    if woke.get("cold_restart"):
        parts.append(f"restarted cold: {woke['cold_restart']}")
    elif woke:
        parts.append(f"woken from level {woke.get('level')} in {woke.get('took_s')} s")
    return "; ".join(parts)
