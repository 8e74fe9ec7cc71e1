"""A soak: hold a model at a fixed concurrency, with periodic saturation bursts at its concurrency
cap, for a duration; sample health and the kernel log (Xid) as it goes; stop at the first fault.

    preflight   the model's port (and GPUs) must be free or held by this model's own engine; the
                config is the one given at start (a frozen copy goes into the run folder), never re-read
    drive       `concurrency` multi-turn conversations always; during a burst (every `burst_every_s`,
                for `burst_for_s`) extra ones up to the cap. Each request is a RequestRecord appended
                to requests.jsonl the moment it ends (point 0 = steady, 1 = sent during a burst)
    watch       every second: is the engine's process alive, and is it computing: requests in flight
                while its progress counters (prompt and generated tokens on /metrics) stay still for
                `stall_after_s` is a stall (the seed's "0 tok/s for ten minutes"); every
                `sample_every_s`: health, new Xid lines since the start, engine RSS; N failed
                requests in a row is a fault too
    end         duration reached (ok), first fault (failed, with evidence), Ctrl-C (failed,
                "interrupted"); every finished request is kept in all three cases

The run folder is the campaign's (servedeck.runs.RunFolder), so `servedeck runs` lists soaks too.
A results directory that cannot be written stops the soak with a RunError naming the file; the
folder is then never marked ok, so nothing half-written is presented as a result.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass
from time import perf_counter
from typing import Any, Callable

import psutil

from servedeck.config import Config
from servedeck.config.schema import merge_request
from servedeck.deck import state as S
from servedeck.deck import launch as L
from servedeck.deck.deck import Deck, classify, describe_exit, footprint_of, settings_of
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.errors import RefusedError, RunError, UsageError
from servedeck.fsio import atomic_write_json
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.records import RequestRecord
from servedeck.soak import windows as W
from servedeck.soak.conversation import Conversation, ProtocolViolation
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R
from servedeck.watch.liveness import progress_made
from servedeck.watch.notices import Notices, Redactor


@dataclass(frozen=True)
class SoakSpec:
    model: str
    duration_s: float
    concurrency: int = 16
    burst_every_s: float = 600.0  # 0: no bursts
    burst_for_s: float = 60.0
    burst_concurrency: int | None = None  # None: the model's cap (slots / max_num_seqs)
    sample_every_s: float = 60.0
    window_s: float = 300.0
    max_tokens: int = 64
    turns: int = 4
    request_timeout_s: float = 300.0
    max_consecutive_errors: int = 5
    stall_after_s: float | None = None  # None: [host] stall_after_s, the watch loop's (default 120 s)

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.sample_every_s <= 0 or self.window_s <= 0:
            raise ValueError("duration, sample interval and window must be positive")
        if self.stall_after_s is not None and self.stall_after_s <= 0:
            raise ValueError("the stall threshold must be positive")
        if self.burst_every_s and self.burst_for_s >= self.burst_every_s:
            raise ValueError(f"a burst ({self.burst_for_s:g} s) must be shorter than its period ({self.burst_every_s:g} s)")


def concurrency_cap(cfg: Config, name: str, boot: dict[str, Any], fallback: int) -> int:
    """What the engine itself will run at once (its adapter knows which flag caps it); else `fallback`."""
    from servedeck.engines import get_engine

    model = cfg.models[name]
    return get_engine(cfg.deck.builds[model.build].engine).concurrency_cap(model, boot) or fallback


def foreign_gpu_processes(inv: Any, gpus: list[int], ours: set[int]) -> list[tuple[int, int]]:
    """(gpu, pid) of compute processes on the model's GPUs (all when none named) that are not ours."""
    if not getattr(inv, "available", False):
        return []
    wanted = set(gpus) if gpus else {g.index for g in inv.gpus}
    return [(g.index, p.pid) for g in inv.gpus if g.index in wanted for p in g.processes if p.pid not in ours]


def preflight(cfg: Config, name: str) -> tuple[LiveRecord, bool]:
    """The model's live record, starting it if nothing holds its port. Refuses a busy port or GPU."""
    model = cfg.models[name]
    rec = S.read_live(name)
    started = False
    if rec and P.alive(rec.pid, rec.create_time):
        if rec.state != LaunchState.READY:
            raise RefusedError(f"cannot soak {name}: it is {rec.state}, not ready", hint="wait, then run again")
        if rec.port != model.port:
            raise RefusedError(f"cannot soak {name}: it runs on port {rec.port} but the config says {model.port}",
                               hint=f"switch {name} again so the running engine matches the config")
    else:
        holder = P.port_holder(model.port)
        if holder is not None:
            who = f"pid {holder['pid']} ({holder.get('name', '?')}: {holder.get('cmdline', '')[:80]})" \
                if holder.get("pid") else "a process servedeck cannot see"
            raise RefusedError(f"cannot soak {name}: port {model.port} is held by {who}, not {name}'s engine",
                               hint="stop that process first; a soak measures only the engine it started or adopted")
        rec = Deck(cfg).start(name).record
        started = True
    ours = set(P.group_members(rec.pgid))
    holder = P.port_holder(model.port)
    if holder is not None and holder.get("pid") and holder["pid"] not in ours:
        raise RefusedError(f"cannot soak {name}: port {model.port} is held by pid {holder['pid']} "
                           f"({holder.get('name', '?')}), which is not {name}'s engine (group {rec.pgid})")
    from servedeck.gpu import nvml

    foreign = foreign_gpu_processes(nvml.inventory(), list(model.gpus), ours)
    if foreign:
        busy = ", ".join(f"GPU {g}: pid {pid}" for g, pid in foreign)
        raise RefusedError(f"cannot soak {name}: its GPUs are busy with other processes ({busy})",
                           hint="a soak must be the only load on its GPUs; stop those processes first")
    return rec, started


def stalled(in_flight: int, quiet_s: float, stall_after_s: float, counters_readable: bool) -> bool:
    """Requests waiting and nothing computed for `stall_after_s`. Without readable counters a long
    answer cannot be told from a stuck engine, so no stall is called (the request timeout still ends it)."""
    return counters_readable and in_flight > 0 and quiet_s >= stall_after_s


def _rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return round(total / 2**20, 1)


class Soak:
    """One soak's driving and bookkeeping. States: ready → running (`main`) → finished; single-use."""

    def __init__(self, cfg: Config, spec: SoakSpec, rec: LiveRecord, cap: int, folder: Any,
                 progress: Callable[[str], None] | None, redactor: Redactor):
        self.cfg, self.spec, self.rec, self.cap, self.folder = cfg, spec, rec, cap, folder
        self.progress = progress or (lambda _line: None)
        self.redact = redactor
        self.records: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.kernel: dict[str, Any] = {"readable": None}
        self.consecutive_errors = 0
        self.interrupted = False
        self.stall_after_s = spec.stall_after_s or cfg.deck.host.stall_after_s
        self.in_flight: dict[str, float] = {}  # request id -> when it was sent (elapsed s)
        self.last_progress_s = 0.0  # when a request last finished, or the engine's counters last grew
        self.t0 = 0.0
        self.start_epoch = 0.0
        self.stop: asyncio.Event | None = None
        self.rss_start = _rss_mib([os.getpid()])
        self.engine_rss_start = _rss_mib(P.group_members(rec.pgid))

    def elapsed(self) -> float:
        return perf_counter() - self.t0

    def in_burst(self, t: float) -> bool:
        b = self.spec.burst_every_s
        return bool(b) and t >= b and (t % b) < self.spec.burst_for_s

    def next_burst(self, t: float) -> float:
        b = self.spec.burst_every_s
        return (int(t // b) + 1) * b

    # --- the run -------------------------------------------------------------------------------
    async def main(self) -> None:
        self.t0, self.start_epoch = perf_counter(), time.time()
        self.stop = asyncio.Event()
        # one connection per worker at most: the pool grows to the workers in flight, never past them
        async with ApiClient(self.rec.base_url, connect_timeout_s=10.0) as client:
            workers = [asyncio.ensure_future(self._worker(client, i, burst=i >= self.spec.concurrency))
                       for i in range(max(self.spec.concurrency, self.cap if self.spec.burst_every_s else 0))]
            guards = [asyncio.ensure_future(self._watchdog()), asyncio.ensure_future(self._sampler()),
                      asyncio.ensure_future(self._stall_watch())]
            try:
                await self.stop.wait()
            except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels us; finish cleanly below
                self.interrupted = True
            for t in workers + guards:
                t.cancel()
            await asyncio.gather(*workers, *guards, return_exceptions=True)

    def _fault(self, kind: str, message: str, **evidence: Any) -> None:
        if self.faults:  # the first fault stops the soak; later ones are its consequences
            return
        self.faults.append(self.redact.data({"kind": kind, "at_s": round(self.elapsed(), 3), "ts": S.now_iso(),
                                             "message": message, **evidence}))
        self.progress(f"FAULT {kind}: {message}")
        assert self.stop is not None
        self.stop.set()

    async def _worker(self, client: ApiClient, i: int, burst: bool) -> None:
        assert self.stop is not None
        n = 0
        conv = Conversation(f"w{i}c{n}", seed=i * 7919 + n, max_turns=self.spec.turns)
        while not self.stop.is_set():
            now = self.elapsed()
            if now >= self.spec.duration_s:  # send nothing past the end; the watchdog stops the rest
                self.stop.set()
                return
            if burst and not self.in_burst(now):
                try:
                    await asyncio.wait_for(self.stop.wait(), timeout=max(0.01, self.next_burst(now) - now))
                except asyncio.TimeoutError:
                    pass
                continue
            if conv.done:
                n += 1
                conv = Conversation(f"w{i}c{n}", seed=i * 7919 + n, max_turns=self.spec.turns)
            ok = await self._turn(client, conv)
            if not ok:  # the history now ends in an unanswered turn; start over rather than guess
                n += 1
                conv = Conversation(f"w{i}c{n}", seed=i * 7919 + n, max_turns=self.spec.turns)

    async def _turn(self, client: ApiClient, conv: Conversation) -> bool:
        messages = conv.ask()
        body = merge_request({"model": self.rec.served_name or self.spec.model, "messages": messages,
                              "max_tokens": self.spec.max_tokens, "temperature": 0.7},
                             dict(self.rec.spec.get("request") or {}))
        rec = RequestRecord(id=f"{conv.id}t{conv.turn}", kind="measured", t_target=self.elapsed())
        rec.t_send = self.elapsed()
        point = int(self.in_burst(rec.t_send))
        if not self.in_flight:  # the quiet clock starts when work is asked for
            self.last_progress_s = rec.t_send
        self.in_flight[rec.id] = rec.t_send
        try:
            r = await client.chat(body, timeout_s=self.spec.request_timeout_s)
            rec.http_status = r.http_status
            if r.http_error:
                rec.status, rec.error = "error", r.http_error
            elif not r.ok:  # refused, timed out, cut off: no answer to read
                rec.status, rec.error = "error", (r.error or "no answer")[:300]
            else:
                data = r.doc
                if not isinstance(data, dict):
                    raise ValueError(f"the answer is not a JSON object: {r.body[:200]}")
                conv.absorb(data)
                usage = data.get("usage") or {}
                rec.prompt_tokens, rec.output_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
                rec.finish_reason = (data.get("choices") or [{}])[0].get("finish_reason")
                rec.timings = data.get("timings")
                rec.status = "ok"
        except asyncio.CancelledError:
            rec.status, rec.error, rec.t_end = "cancelled", "soak ended while in flight", self.elapsed()
            self.in_flight.pop(rec.id, None)
            self._record(rec, point)
            raise
        except (ValueError, ProtocolViolation) as e:
            rec.status, rec.error = "error", f"{type(e).__name__}: {e}"[:300]
        rec.t_end = self.elapsed()
        self.in_flight.pop(rec.id, None)
        if rec.status == "ok":
            self.last_progress_s = rec.t_end
        self._record(rec, point)
        if rec.status == "ok":
            self.consecutive_errors = 0
            return True
        self.consecutive_errors += 1
        if self.consecutive_errors >= self.spec.max_consecutive_errors:
            # failures in a row usually mean the engine died: give its shim a moment to end, so the
            # fault names the death and its cause rather than only its symptom
            for _ in range(30):
                if not P.alive(self.rec.pid, self.rec.create_time):
                    self._fault("engine-died", "the engine's process ended during the soak", **self._death_evidence())
                    return False
                await asyncio.sleep(0.1)
            self._fault("requests", f"{self.consecutive_errors} requests failed in a row; last: {rec.error}")
        return False

    def _record(self, rec: RequestRecord, point: int) -> None:
        line = {**rec.to_json(), "point": point}
        self.records.append(line)
        try:
            self.folder.request(line)
        except RunError as e:  # the folder's own words: a full disk names the file and the free space
            self._fault("results", e.message)
        except OSError as e:
            self._fault("results", f"cannot write {self.folder.path / 'requests.jsonl'}: {e.strerror or e}")

    async def _watchdog(self) -> None:
        """Every second: duration reached? engine process still alive?"""
        assert self.stop is not None
        while not self.stop.is_set():
            if self.elapsed() >= self.spec.duration_s:
                self.stop.set()
                return
            if not P.alive(self.rec.pid, self.rec.create_time):
                self._fault("engine-died", "the engine's process ended during the soak", **self._death_evidence())
                return
            await asyncio.sleep(1.0)

    async def _stall_watch(self) -> None:
        """Every second: the engine's progress counters. An engine can answer /health and /metrics while
        its compute loop is wedged (llama.cpp's ggml-org/llama.cpp#27388 did so here, mid-suite): the
        soak's requests then wait for their timeout and the soak would end "ok" with none answered."""
        from servedeck.engines import get_engine
        from servedeck.engines.metrics import read_counters

        assert self.stop is not None
        names = get_engine(self.rec.engine).metrics
        last: dict[str, float] | None = None
        while not self.stop.is_set():
            now_counters = await asyncio.to_thread(read_counters, self.rec.base_url, names, 3.0)
            now = self.elapsed()
            if progress_made(last, now_counters):
                self.last_progress_s = now
            if now_counters is not None:
                last = now_counters
            quiet = now - self.last_progress_s
            if stalled(len(self.in_flight), quiet, self.stall_after_s, now_counters is not None):
                oldest = now - min(self.in_flight.values())
                shown = ", ".join(f"{k}={v:g}" for k, v in sorted((now_counters or {}).items()))
                self._fault("stalled", f"{len(self.in_flight)} requests in flight (the oldest for {oldest:.0f} s) and "
                                       f"the engine computed nothing for {quiet:.0f} s: its progress counters did not "
                                       f"move ({shown}); it still answers /metrics",
                            counters=now_counters, in_flight=len(self.in_flight), quiet_s=round(quiet, 1),
                            stall_after_s=self.stall_after_s,
                            log_tail=self._log_tail(), launch_dir=self.rec.launch_dir)
                return
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass

    def _death_evidence(self) -> dict[str, Any]:
        from pathlib import Path

        d = Path(self.rec.launch_dir)
        exit_info = R.wait_exit(d, 3.0)  # let the shim write exit.json
        mine = footprint_of(d, self.rec.image, self.rec.pid, self.rec.engine_pid)
        cause = classify(L.log_for_causes(d), exit_info, time.time(), self.rec.engine, mine)
        return {"exit": exit_info, "detail": describe_exit(exit_info), "cause": cause,
                "log_tail": self._log_tail(), "launch_dir": str(d)}

    def _log_tail(self) -> list[str]:
        """The engine log's last 15 lines, the evidence every fault carries."""
        from pathlib import Path

        return L.log_tail(Path(self.rec.launch_dir), 40).splitlines()[-15:]

    async def _sampler(self) -> None:
        """Every `sample_every_s` (first at once): health, Xid since the start, engine RSS."""
        assert self.stop is not None
        unhealthy = 0
        while not self.stop.is_set():
            spec = _spec(self.rec)
            ok, why = await asyncio.to_thread(R.health_ok, spec, 10.0)
            xids = await asyncio.to_thread(self._xids)
            s = {"at_s": round(self.elapsed(), 1), "health": why, "healthy": ok, "xids": len(xids),
                 "engine_rss_mib": _rss_mib(P.group_members(self.rec.pgid)),
                 "servedeck_rss_mib": _rss_mib([os.getpid()]),
                 "requests": len(self.records), "errors": sum(r["status"] == "error" for r in self.records)}
            self.samples.append(s)
            self.progress(f"sample: health {why}, {s['requests']} requests ({s['errors']} errors), "
                          f"engine RSS {s['engine_rss_mib']} MiB, Xid {len(xids)}")
            if xids:
                self._fault("xid", f"kernel reported Xid {xids[0]['code']} during the soak: {xids[0]['meaning']}",
                            kernel_events=xids)
            unhealthy = unhealthy + 1 if not ok else 0
            if unhealthy >= 2:  # one slow /health under saturation is not yet a fault
                self._fault("unhealthy", f"health check failed twice in a row ({why})")
            try:
                self.folder.update(samples=self.samples[-1000:], progress={"requests": len(self.records),
                                                                            "elapsed_s": round(self.elapsed(), 1)})
            except OSError as e:
                self._fault("results", f"cannot write {self.folder.path / 'summary.json'}: {e.strerror or e}")
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=self.spec.sample_every_s)
            except asyncio.TimeoutError:
                pass

    def _xids(self) -> list[dict[str, Any]]:
        try:
            from servedeck.doctor.kernel import read_kernel_events
        except ImportError:  # doctor not installed: say so rather than claim a clean kernel log
            self.kernel = {"readable": False, "reason": "servedeck.doctor.kernel is not available"}
            return []
        log = read_kernel_events(boots="current", since=self.start_epoch)
        self.kernel = {"readable": log.readable, "source": log.source, "reason": log.reason}
        return [e.to_json() for e in log.xids]

    # --- the result ----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        end = self.elapsed()
        bad = [r["t_end"] for r in self.records if r["status"] == "error" and r.get("t_end") is not None]
        bad += [f["at_s"] for f in self.faults]
        clean = W.longest_clean(bad, end)
        if self.faults:
            status, reason = "failed", f"fault after {self.faults[0]['at_s']:.0f} s: {self.faults[0]['message']}"
        elif self.interrupted:
            status, reason = "failed", f"interrupted (Ctrl-C) after {end:.0f} s; every finished request is kept"
        else:
            status, reason = "ok", None
        return {"status": status, "reason": reason, "elapsed_s": round(end, 3), "counts": W.counts(self.records),
                "windows": W.windows(self.records, self.spec.window_s, min(end, self.spec.duration_s)), "faults": self.faults,
                "longest_clean_window_s": clean["seconds"], "longest_clean_window": clean,
                "samples": self.samples[-1000:], "kernel_log": self.kernel,
                "servedeck_rss_mib": {"start": self.rss_start, "end": _rss_mib([os.getpid()])},
                "engine_rss_mib": {"start": self.engine_rss_start,
                                   "end": _rss_mib(P.group_members(self.rec.pgid))}}


def _spec(rec: LiveRecord) -> Any:
    return rec.probe_spec()


class SoakRun:
    """One soak from preflight to summary. `open_soak` (blocking: may start the model through the deck)
    → `await main()` (the load, in the caller's event loop) → `finish()` (writes the folder's verdict)."""

    def __init__(self, soak: Soak, folder: Any, notices: Notices, redactor: Redactor):
        self.soak, self.folder, self.notices, self.redactor = soak, folder, notices, redactor

    async def main(self) -> None:
        from servedeck.telemetry.point import sampled_soak

        try:
            async with sampled_soak(self.folder, self.soak.rec, self.soak.records):  # telemetry.jsonl beside it
                await self.soak.main()
        except asyncio.CancelledError:  # Ctrl-C under asyncio.run: keep what finished, finish() says so
            self.soak.interrupted = True

    def finish(self) -> dict[str, Any]:
        soak, folder, name = self.soak, self.folder, self.soak.spec.model
        summary = self.redactor.data(soak.summary())
        try:
            folder.update(**{k: v for k, v in summary.items() if k not in ("status", "reason")})
            folder.finish(summary["status"], summary["reason"])
        except OSError as e:
            raise RunError(f"the soak ran but its run folder {folder.path} could not be written: {e.strerror or e}; "
                           "it is not a result", hint="free space or fix permissions, then soak again") from None
        results = [f for f in soak.faults if f["kind"] == "results"]
        if results:  # requests were lost from the folder: the run must not read as complete
            raise RunError(results[0]["message"] + f"; the soak stopped and {folder.path} is marked failed",
                           hint="free space or fix permissions under the results directory, then soak again")
        self.notices.emit("soak", name, f"soak of {name} {summary['status']}: {summary['reason'] or 'no fault'}; "
                                        f"{summary['counts']['total']} requests, {summary['counts']['error']} errors",
                          run=str(folder.path))
        return {**summary, "path": str(folder.path)}


def open_soak(cfg: Config, spec: SoakSpec, progress: Callable[[str], None] | None = None,
              notices: Notices | None = None) -> SoakRun:
    """Preflight (adopt the running model or start it) and open the run folder. Raises RefusedError
    (busy port/GPU) before anything runs, RunError when the run folder cannot be written."""
    from servedeck.runs.folder import RunFolder, runs_root

    name = spec.model
    limit = cfg.models[name].max_output_tokens
    if limit and spec.max_tokens > limit:  # refused before anything starts, as the bench refuses it
        raise UsageError(f"--max-tokens {spec.max_tokens} is above models.{name}.max_output_tokens ({limit})",
                         hint=f"ask for {limit} or fewer (--max-tokens {limit}), or raise max_output_tokens")
    redactor = Redactor.from_config(cfg)
    notices = notices or Notices(cfg.deck.host.on_notice, redactor)
    rec, started = preflight(cfg, name)
    model = cfg.models[name]
    cap = spec.burst_concurrency or concurrency_cap(cfg, name, rec.boot, 2 * spec.concurrency)
    frozen = redactor.data({"host": cfg.deck.host.model_dump(mode="json"), **settings_of(name, cfg)})
    workload = {"kind": "soak", **asdict(spec), "burst_concurrency": cap}
    folder = RunFolder.create(runs_root(cfg.deck.host.results_dir), name, model.layout, model.context,
                              rec.engine, {"kind": "soak", "model": name, "engine": rec.engine,
                                           "base_url": rec.base_url, "workload": workload,
                                           "started_engine": started, "config": frozen,
                                           "points": [{"index": 0, "label": f"steady c={spec.concurrency}"},
                                                      {"index": 1, "label": f"bursts c={cap}"}]})
    try:
        atomic_write_json(folder.path / "config.json", frozen)  # the frozen copy the soak ran with
        folder.scrub = redactor.text
        folder.attach_launch(rec.launch_dir, whole_log=started)
    except OSError as e:
        raise RunError(f"cannot write the run folder {folder.path}: {e.strerror or e}",
                       hint="free space or fix permissions under the results directory, then run again") from None
    notices.emit("soak", name, f"soak of {name} started: {spec.duration_s:g} s at c={spec.concurrency}, "
                               f"bursts to c={cap}", run=str(folder.path))
    return SoakRun(Soak(cfg, spec, rec, cap, folder, progress, redactor), folder, notices, redactor)
