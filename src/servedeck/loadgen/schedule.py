"""Load shapes: when each request is sent, and the bookkeeping of a run.

Closed loop: N workers; each sends its next request when its previous one ends (the end is that
request's target time, so client overhead between requests shows up as schedule lag).
Open loop: arrivals at a rate, constant, Poisson or gamma (seeded), at `start + offset_i` from one fixed
start, never from the previous request, so a slow client is visible as lag instead of silently
lowering the rate.

A run is: warm-up (its own prompts, kind="warmup", closed loop) → measured phase → drain. Every
record goes to `on_record` as it finishes. Cancelling the run (Ctrl-C under asyncio.run, or
task.cancel()) cancels what is in flight; those requests are recorded as "cancelled", finished
ones are kept, and CancelledError propagates. `LoadRun.result()` is valid at any point.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter, process_time
from typing import Any, Literal

from servedeck.loadgen.client import Streamer
from servedeck.loadgen.loop import current as current_loop
from servedeck.loadgen.records import Kind, RequestRecord, RequestSpec


async def sleep_until(t: float) -> None:
    """Return at perf_counter() >= t, never before. A loop's timer can fire early: uvloop (libuv) counts
    a delay in whole milliseconds from a cached clock, so a sleep ended up to 0.42 ms short here, and a
    request went out before its scheduled time (35 µs early in a trace replay, 2026-12-04). The
    remainder is slept again; what is left under a millisecond costs a few loop turns."""
    while (delay := t - perf_counter()) > 0:
        await asyncio.sleep(delay)


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


@dataclass(frozen=True)
class OpenLoop:
    rate: float  # requests per second
    arrivals: Literal["constant", "poisson", "gamma"] = "constant"
    seed: int = 0  # poisson/gamma: same seed, same send times
    # gamma only: the shape k of the gaps (vLLM's --burstiness). k = 1 is Poisson; k < 1 burstier,
    # k > 1 more regular; the mean gap stays 1/rate.
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.arrivals not in ("constant", "poisson", "gamma"):
            raise ValueError(f"arrivals must be 'constant', 'poisson' or 'gamma', got {self.arrivals!r}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")

    def offsets(self) -> Iterator[float]:
        """Targeted send times in seconds after the phase start; the first is 0."""
        if self.arrivals == "constant":
            for i in itertools.count():
                yield i / self.rate
        rng = random.Random(self.seed)
        k = self.burstiness if self.arrivals == "gamma" else 1.0
        t = 0.0
        while True:
            yield t
            t += rng.gammavariate(k, 1.0 / (self.rate * k))


Shape = ClosedLoop | OpenLoop


@dataclass(frozen=True)
class Progress:
    phase: Kind
    done: int  # finished in this phase (any status)
    errors: int  # of those, not ok
    in_flight: int
    total: int | None  # requests planned in this phase, None when bounded by duration only
    elapsed_s: float  # since the phase started
    duration_s: float | None


@dataclass
class LoadResult:
    """A run's records plus what the stats need about the run itself (times relative to t0)."""

    t0: float  # absolute perf_counter() at run start; records are relative to it
    shape: dict[str, Any]
    records: list[RequestRecord]
    measured_start: float | None  # when the measured phase began
    measured_end: float | None  # when its last request finished (or the run was cancelled)
    cpu_s: float  # the client's CPU time during the measured phase (all its processes)
    wall_s: float  # wall time of the measured phase
    stop_reason: str  # "requests" | "duration" | "exhausted" | "cancelled" | "failed"
    loop: str = ""  # the event loop the client ran on ("uvloop", "asyncio")
    # One entry per client process when the streams were split across processes (--client-procs):
    # {"index", "streams", "requests", "cpu_s", "wall_s", "cpu_fraction", "lag_p99_ms", "loop"}.
    procs: list[dict[str, Any]] | None = None
    gc: dict[str, Any] | None = None  # how the garbage collector was handled (_QuietGC.facts)
    # The loop thread's time runnable but waiting for a core over the measured phase (Linux schedstat; None
    # elsewhere), and the host's cores this client may use with how many of them were busy (host_cores).
    wait_s: float | None = None
    host: dict[str, Any] | None = None

    def meta(self) -> dict[str, Any]:
        """Everything but the records, JSON-able (records go to requests.jsonl one by one)."""
        return {
            "t0_perf_counter": self.t0,
            "shape": self.shape,
            "measured_start": self.measured_start,
            "measured_end": self.measured_end,
            "client_cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "stop_reason": self.stop_reason,
            "n_records": len(self.records),
            "loop": self.loop,
            "client_procs": self.procs,
            "gc": self.gc,
            "client_wait_s": self.wait_s,
            "host": self.host,
        }


def shape_json(shape: Shape) -> dict[str, Any]:
    if isinstance(shape, ClosedLoop):
        return {"type": "closed", "concurrency": shape.concurrency}
    return {"type": "open", "rate": shape.rate, "arrivals": shape.arrivals, "seed": shape.seed,
            "burstiness": shape.burstiness}


def thread_wait() -> float | None:
    """Seconds this thread has been runnable but waiting for a core (Linux /proc schedstat), None where the
    kernel does not say. Beside its CPU time it tells a loop short of CPU (never idle: running or waiting) from
    one that slept between chunks (loadgen/pace.py)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def host_cores() -> tuple[int, float] | None:
    """(cores this process may run on, CPU-seconds they have been busy so far), to take a difference of. The
    process's set, which its client processes get (procs.py), whatever set the calling thread is held to."""
    try:
        import os

        import psutil

        allowed = sorted(os.sched_getaffinity(os.getpid()))  # the process's (its client processes get it), not this thread's
        times = psutil.cpu_times(percpu=True)
        busy = sum(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
                   + getattr(t, "steal", 0.0) for i, t in enumerate(times) if i in allowed)
        return len(allowed), busy
    except (AttributeError, OSError, ImportError):
        return None


def host_use(before: tuple[int, float] | None, after: tuple[int, float] | None, wall_s: float,
             client_cpu_s: float | None) -> dict[str, Any] | None:
    """The host over a window: its cores, how many were busy, and how many were free of anything but the client
    (what more client processes could use)."""
    if before is None or after is None or not wall_s > 0:
        return None
    busy = max(0.0, (after[1] - before[1]) / wall_s)
    client = (client_cpu_s or 0.0) / wall_s
    return {"cores": after[0], "busy_cores": busy, "client_cores": client,
            "free_cores": max(0.0, after[0] - max(0.0, busy - client))}


class LoadRun:
    """One run. States: ready → running (`run`) → finished | cancelled | failed. `run` is
    single-use; a second call raises RuntimeError."""

    def __init__(
        self,
        client: Streamer,
        shape: Shape,
        requests: Iterable[RequestSpec],
        *,
        warmup: Sequence[RequestSpec] = (),
        max_requests: int | None = None,
        duration_s: float | None = None,
        warmup_concurrency: int | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        t0: float | None = None,
        start_gate: Callable[[], Awaitable[float]] | None = None,
        offsets: Sequence[float] | None = None,
        quiet_gc: bool = True,
    ) -> None:
        """`t0`, `start_gate` and `offsets` let several processes share one schedule (procs.py):
        `t0` the run clock's origin (absolute perf_counter; default: when `run` starts);
        `start_gate` is awaited after warm-up and returns the absolute perf_counter at which the
        measured phase starts; `offsets` (open loop) the send offsets of this process's requests
        from that start, in place of the shape's own. `quiet_gc`: see _QuietGC."""
        if max_requests is not None and max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        if duration_s is not None and not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        self.client = client
        self.shape = shape
        self._requests = requests
        self._warmup = list(warmup)
        # A warm-up prompt sent again would make a measured request a prefix-cache hit.
        self._warmup_prompts = {s.prompt for s in self._warmup}
        self.max_requests = max_requests
        self.duration_s = duration_s
        default_wc = shape.concurrency if isinstance(shape, ClosedLoop) else 4
        self.warmup_concurrency = max(1, min(warmup_concurrency or default_wc, len(self._warmup) or 1))
        self.on_record = on_record
        self.on_progress = on_progress
        self.records: list[RequestRecord] = []
        self.state = "ready"
        self.t0 = t0 or 0.0
        self._t0_given = t0 is not None
        self._start_gate = start_gate
        self._offsets = offsets
        self._loop = ""
        self._gc = _QuietGC() if quiet_gc else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._phase: Kind = "warmup"
        self._phase_start = 0.0
        self._phase_done = 0
        self._phase_errors = 0
        self._phase_total: int | None = None
        self._measured_start: float | None = None
        self._measured_end: float | None = None
        self._cpu0 = 0.0
        self._cpu_s = 0.0
        self._wait0: float | None = None
        self._wait_s: float | None = None
        self._host0: tuple[int, float] | None = None
        self._host: dict[str, Any] | None = None
        self._stop_reason = "exhausted"
        self._main: asyncio.Task[Any] | None = None
        self._failure: BaseException | None = None  # raised by a request task (on_record, say)
        self._dispatching = False  # the open-loop dispatcher is running (may be cancelled)
        self._unreported: list[RequestRecord] = []  # finished, not yet given to on_record
        self._flush_scheduled = False

    # ---- public --------------------------------------------------------------------------

    async def run(self) -> LoadResult:
        if self.state != "ready":
            raise RuntimeError(f"LoadRun.run called in state {self.state!r}; a run is single-use")
        self.state = "running"
        self._main = asyncio.current_task()
        self._loop = current_loop()
        if not self._t0_given:
            self.t0 = perf_counter()
        try:
            if self._warmup:
                self._start_phase("warmup", len(self._warmup))
                await self._closed(self.warmup_concurrency, iter(self._warmup), "warmup")
                self._flush(from_loop=False)
            if self._gc is not None:
                self._gc.start()  # before the clock starts: its one full collection is not lag
            # Also before it: host_cores's first call imports psutil, 20-55 ms in a fresh client process
            # (procs.py), which was every process's first request late by as much (an H100 host, 2026-12-06)
            host_cores()
            start_at = None
            if self._start_gate is not None:
                start_at = await self._start_gate()
                await sleep_until(start_at)
            self._start_phase("measured", self._planned(), start_at)
            self._measured_start = self._phase_start - self.t0
            self._cpu0 = process_time()
            self._wait0, self._host0 = thread_wait(), host_cores()
            specs = iter(self._requests)
            if self.max_requests is not None:
                specs = itertools.islice(specs, self.max_requests)
            if isinstance(self.shape, ClosedLoop):
                await self._closed(self.shape.concurrency, specs, "measured")
            else:
                await self._open(self.shape, specs)
            self._flush(from_loop=False)
            if self._failure is not None:
                raise self._failure
            self.state = "finished"
        except asyncio.CancelledError:
            failed = self._failure is not None
            self.state, self._stop_reason = ("failed", "failed") if failed else ("cancelled", "cancelled")
            await self._cancel_in_flight()
            if self._failure is not None:
                raise self._failure from None
            raise
        except BaseException:
            self.state, self._stop_reason = "failed", "failed"
            await self._cancel_in_flight()
            raise
        finally:
            if self._gc is not None:
                self._gc.stop()
            self._close_measured()
        return self.result()

    def result(self) -> LoadResult:
        return LoadResult(
            t0=self.t0,
            shape=shape_json(self.shape),
            records=list(self.records),
            measured_start=self._measured_start,
            measured_end=self._measured_end,
            cpu_s=self._cpu_s,
            wall_s=(self._measured_end - self._measured_start)
            if self._measured_start is not None and self._measured_end is not None
            else 0.0,
            stop_reason=self._stop_reason,
            loop=self._loop,
            gc=self._gc.facts() if self._gc is not None else {"quiet": False},
            wait_s=self._wait_s,
            host=self._host,
        )

    # ---- phases --------------------------------------------------------------------------

    def _planned(self) -> int | None:
        if self.max_requests is not None:
            return self.max_requests
        if isinstance(self._requests, Sequence) and self.duration_s is None:
            return len(self._requests)
        return None

    def _start_phase(self, phase: Kind, total: int | None, start_at: float | None = None) -> None:
        self._phase, self._phase_total = phase, total
        self._phase_done = self._phase_errors = 0
        self._phase_start = perf_counter() if start_at is None else start_at
        self._progress()

    def _close_measured(self) -> None:
        if self._measured_start is None or self._measured_end is not None:
            return
        self._cpu_s = process_time() - self._cpu0
        wait = thread_wait()
        self._wait_s = wait - self._wait0 if wait is not None and self._wait0 is not None else None
        wall = perf_counter() - self.t0 - self._measured_start
        self._host = host_use(self._host0, host_cores(), wall, self._cpu_s)
        ends = [r.t_end for r in self.records if r.kind == "measured" and r.t_end is not None]
        self._measured_end = max(ends) if ends else perf_counter() - self.t0

    def _past_deadline(self, now: float) -> bool:
        if self._phase == "measured" and self.duration_s is not None:
            if now - self._phase_start >= self.duration_s:
                self._stop_reason = "duration"
                return True
        return False

    async def _closed(self, n: int, specs: Iterator[RequestSpec], kind: Kind) -> None:
        start = self._phase_start
        exhausted = False

        async def worker() -> None:
            nonlocal exhausted
            target = start
            while not exhausted and not self._past_deadline(perf_counter()):
                spec = next(specs, None)
                if spec is None:
                    exhausted = True
                    return
                rec = await self._one(spec, kind, target)
                # The next request is due the moment this one ended; whatever the client does
                # in between (parsing, bookkeeping) is lag, not latency.
                target = rec.t_end + self.t0 if rec.t_end is not None else perf_counter()

        await self._gather([asyncio.ensure_future(worker()) for _ in range(n)])
        if exhausted and kind == "measured" and self._stop_reason == "exhausted" and self.max_requests:
            self._stop_reason = "requests"

    async def _open(self, shape: OpenLoop, specs: Iterator[RequestSpec]) -> None:
        start = self._phase_start
        self._dispatching = True
        try:
            offsets = iter(self._offsets) if self._offsets is not None else shape.offsets()
            for offset, spec in zip(offsets, specs):
                if self.duration_s is not None and offset >= self.duration_s:
                    self._stop_reason = "duration"
                    break
                target = start + offset
                await sleep_until(target)
                self._spawn(self._one(spec, "measured", target))
            else:
                if self.max_requests:
                    self._stop_reason = "requests"
        finally:
            self._dispatching = False
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._failure is not None:
            raise self._failure

    # ---- one request ---------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # An open-loop request task that failed (a warm-up prompt reused, say) must stop the
        # run now, not when the dispatcher finally gathers.
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()
            if self._dispatching and self._main is not None:
                self._main.cancel()

    async def _gather(self, tasks: list[asyncio.Future[Any]]) -> None:
        for t in tasks:
            if isinstance(t, asyncio.Task):
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
        await asyncio.gather(*tasks)

    async def _one(self, spec: RequestSpec, kind: Kind, target: float) -> RequestRecord:
        if kind == "measured" and spec.prompt in self._warmup_prompts:
            raise ValueError(f"request {spec.id} reuses a warm-up prompt; it would hit the prefix cache")
        rec = RequestRecord(id=spec.id, kind=kind, t_target=target - self.t0, prompt_index=spec.index,
                            prompt_digest=spec.digest)
        self._in_flight += 1
        try:
            await self.client.send(spec, rec, self.t0)
        except asyncio.CancelledError:
            _close_as(rec, self.t0, "cancelled", "cancelled before it finished")
            raise
        except Exception as e:  # a client bug must cost one record, not the run
            _close_as(rec, self.t0, "error", f"client raised {type(e).__name__}: {e}")
        finally:
            self._in_flight -= 1
            if rec.status is None:
                _close_as(rec, self.t0, "cancelled", "cancelled before it finished")
            self._finished(rec)
        return rec

    def _finished(self, rec: RequestRecord) -> None:
        # on_record (a JSON line to disk) is run after the sends due now, not before them: when
        # 256 streams end in the same decode step, 256 file writes ahead of the next requests
        # would be schedule lag the server never caused.
        self.records.append(rec)
        if rec.kind == self._phase:
            self._phase_done += 1
            self._phase_errors += rec.status != "ok"
        self._unreported.append(rec)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self, from_loop: bool = True) -> None:
        """Hand finished records to on_record and report progress (idempotent)."""
        self._flush_scheduled = False
        batch, self._unreported = self._unreported, []
        try:
            if self.on_record is not None:
                for rec in batch:
                    self.on_record(rec)
            if batch:
                self._progress()
        except Exception as e:  # usually a loop callback: hand the error to the run itself
            if self._failure is None:
                self._failure = e
                if from_loop and self.state == "running" and self._main is not None:
                    self._main.cancel()

    def _progress(self) -> None:
        if self.on_progress is None:
            return
        self.on_progress(
            Progress(
                phase=self._phase,
                done=self._phase_done,
                errors=self._phase_errors,
                in_flight=self._in_flight,
                total=self._phase_total,
                elapsed_s=perf_counter() - self._phase_start,
                duration_s=self.duration_s if self._phase == "measured" else None,
            )
        )

    async def _cancel_in_flight(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        # Let each request record itself as cancelled before the run reports back.
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flush(from_loop=False)


class _QuietGC:
    """No automatic garbage collection while the measured phase runs.

    Profiled at 256 streams on 2 busy cores (docs/loadgen.md): CPython's automatic collections
    stopped the client's loop for up to 9-15 ms (generation 1) and 2-3 ms (generation 0) of CPU
    several times a second, and a stopped loop stamps every chunk that arrives meanwhile late. The
    client makes no cyclic garbage per request (a full collection after a 256-stream run found 0
    objects), so reference counting frees everything; the collector is only put off: one full
    collection and a freeze before the clock starts (what exists then is never scanned again), a
    young-generation collection every `every_s` as a bound on the unexpected (an error's
    traceback cycle), and the collector back as it was when the phase ends.
    """

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self.was_enabled = False
        self.active = False
        self.periodic = 0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        self.active = True
        self._timer = asyncio.get_running_loop().call_later(self.every_s, self._tick)

    def _tick(self) -> None:
        gc.collect(1)
        self.periodic += 1
        self._timer = asyncio.get_running_loop().call_later(self.every_s, self._tick)

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
        if self.was_enabled:
            gc.enable()

    def facts(self) -> dict[str, Any]:
        return {"quiet": True, "automatic_during_measured": False, "periodic_collections": self.periodic,
                "every_s": self.every_s}


def _close_as(rec: RequestRecord, t0: float, status: Literal["error", "cancelled"], why: str) -> None:
    if rec.status is not None:
        return
    rec.status = status
    rec.error = why
    rec.t_end = perf_counter() - t0


async def run_load(
    client: Streamer,
    shape: Shape,
    requests: Iterable[RequestSpec],
    **kwargs: Any,
) -> LoadResult:
    """Convenience: `LoadRun(client, shape, requests, **kwargs).run()`."""
    return await LoadRun(client, shape, requests, **kwargs).run()
