"""One load run split across client processes (`servedeck bench --client-procs N`).

On a host with spare cores one Python process is still one core: past some tens of thousands of
streamed tokens a second its event loop, not the server, sets the pace. `ProcessLoadRun` deals the
streams out to N processes that keep ONE schedule: one run clock (`t0`, an absolute
`perf_counter`, which is CLOCK_MONOTONIC and so the same in every process of the host), one
measured start given to all of them once each has finished its share of the warm-up, and, for an
open loop, the send offsets computed once here and dealt round-robin (request i goes out at
start + offset_i whichever process sends it). Each process runs a plain `LoadRun` with its own
`StreamingClient`; its records come back over a pipe as they finish (so `on_record` still writes
each one the moment it ends) and are merged into one `LoadResult` whose `procs` holds each
process's CPU, wall time, lag and loop: the self-check judges every process on its own.

Processes are started with the "spawn" method (a fork of a process with a running event loop
shares its loop's file descriptors), ignore SIGINT (the parent decides), stop when told or when
the parent's pipe closes, and are joined, then killed if they linger: none outlives the run.

Lifecycle as LoadRun: ready → running (`run`) → finished | cancelled | failed; `result()` is valid
at any point.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter
from typing import Any

from servedeck.loadgen.client import ClientConfig, StreamingClient
from servedeck.loadgen.loop import current as current_loop, preferred, run as run_loop
from servedeck.loadgen.records import RequestRecord, RequestSpec
from servedeck.loadgen.schedule import (ClosedLoop, LoadResult, LoadRun, OpenLoop, Progress, Shape, host_cores, host_use,
                                       shape_json)

# Requests for a split run: a list (dealt round-robin), or a picklable zero-argument callable that
# returns an iterator (each process takes every N-th item of its own copy): a duration-bounded run
# has no end to pickle.
Requests = Sequence[RequestSpec] | Callable[[], Iterator[RequestSpec]]

_START_MARGIN_S = 0.05  # the start is sent this far ahead, so every process has it in time


def split(n: int, parts: int) -> list[int]:
    """n as `parts` near-equal shares, larger first: split(10, 4) == [3, 3, 2, 2]."""
    return [n // parts + (i < n % parts) for i in range(parts)]


class ProcessLoadRun:
    """A LoadRun over `procs` client processes; same arguments as LoadRun plus the client config."""

    def __init__(
        self,
        config: ClientConfig,
        shape: Shape,
        requests: Requests,
        *,
        procs: int,
        warmup: Sequence[RequestSpec] = (),
        max_requests: int | None = None,
        duration_s: float | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        prewarm: int | None = None,
        start_timeout_s: float = 120.0,
        quiet_gc: bool = True,
    ) -> None:
        if procs < 1:
            raise ValueError(f"procs must be >= 1, got {procs}")
        if max_requests is not None and max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        if duration_s is not None and not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        if not isinstance(requests, Sequence) and not callable(requests):
            raise ValueError("requests for several client processes must be a list or a picklable "
                             "zero-argument callable returning an iterator (a generator cannot be split)")
        if isinstance(shape, ClosedLoop):
            procs = min(procs, shape.concurrency)  # a process without a stream would only cost a start
        self.config, self.shape, self.requests, self.procs = config, shape, requests, procs
        self.warmup = list(warmup)
        self.max_requests, self.duration_s = max_requests, duration_s
        self.on_record, self.on_progress = on_record, on_progress
        self.prewarm = prewarm
        self.quiet_gc = quiet_gc
        self.start_timeout_s = start_timeout_s
        self.state = "ready"
        self.t0 = 0.0
        self.records: list[RequestRecord] = []
        self._proc_of: list[int] = []  # process index of each record
        self._done: dict[int, dict[str, Any]] = {}  # index -> the process's closing meta
        self._measured_start: float | None = None
        self._stop_reason = "exhausted"
        self._phase_done = self._phase_errors = 0
        self._streams: list[int] = []
        self._host0: tuple[int, float] | None = None  # the host's cores at the measured start (host_cores)
        self._host_end: tuple[int, float] | None = None

    # ---- the plan: what each process gets -------------------------------------------------------

    def _plans(self) -> list[dict[str, Any]]:
        n = self.procs
        seq = self.requests if isinstance(self.requests, Sequence) else None
        plans: list[dict[str, Any]] = []
        if isinstance(self.shape, ClosedLoop):
            streams = split(self.shape.concurrency, n)
            quotas = split(self.max_requests, n) if self.max_requests is not None else [None] * n
            offsets: list[Sequence[float] | None] = [None] * n
            shapes: list[Shape] = [ClosedLoop(c) for c in streams]
        else:
            planned = self._open_offsets(seq)
            offsets = [planned[i::n] for i in range(n)]
            quotas = [len(o) for o in offsets]
            shapes = [self.shape] * n
            streams = [0] * n  # an open loop has no fixed stream count per process
        self._streams = streams
        for i in range(n):
            plans.append({
                "index": i, "procs": n, "config": self.config, "shape": shapes[i],
                "requests": list(seq[i::n]) if seq is not None else self.requests,
                "warmup": self.warmup[i::n], "max_requests": quotas[i], "duration_s": self.duration_s,
                "offsets": offsets[i], "t0": self.t0, "loop": preferred(), "quiet_gc": self.quiet_gc,
                "prewarm": self.prewarm if self.prewarm is not None else (streams[i] or 16),
            })
        return plans

    def _open_offsets(self, seq: Sequence[RequestSpec] | None) -> list[float]:
        assert isinstance(self.shape, OpenLoop)
        bounds = [b for b in (len(seq) if seq is not None else None, self.max_requests) if b is not None]
        out: list[float] = []
        for off in self.shape.offsets():
            if (bounds and len(out) >= min(bounds)) or (self.duration_s is not None and off >= self.duration_s):
                break
            if not bounds and self.duration_s is None:
                raise ValueError("an open loop over an endless request source needs max_requests or duration_s")
            out.append(off)
        return out

    # ---- running --------------------------------------------------------------------------------

    async def run(self) -> LoadResult:
        if self.state != "ready":
            raise RuntimeError(f"ProcessLoadRun.run called in state {self.state!r}; a run is single-use")
        self.state = "running"
        self.t0 = perf_counter()
        plans = self._plans()
        ctx = multiprocessing.get_context("spawn")
        workers: list[tuple[Any, multiprocessing.connection.Connection]] = []
        try:
            for plan in plans:
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=_child, args=(theirs, plan), name=f"servedeck-client-{plan['index']}",
                                daemon=True)
                p.start()
                _process_cores(p.pid)
                theirs.close()
                workers.append((p, mine))
            await self._serve([c for _, c in workers])
            self.state = "finished"
        except asyncio.CancelledError:
            self.state, self._stop_reason = "cancelled", "cancelled"
            raise
        except BaseException:
            self.state, self._stop_reason = "failed", "failed"
            raise
        finally:
            await self._stop_all(workers)
        return self.result()

    async def _stop_all(self, workers: list[tuple[Any, multiprocessing.connection.Connection]]) -> None:
        """Ask each process to stop, keep the records it sends meanwhile (requests it cancels are
        recorded as such, as in LoadRun), then end it if it lingers."""
        for _, c in workers:
            try:
                c.send(("stop", None))
            except (OSError, ValueError):
                pass
        loop = asyncio.get_running_loop()
        end = loop.time() + 10.0
        for i, (p, c) in enumerate(workers):
            while loop.time() < end:
                try:
                    while c.poll():
                        what, payload = c.recv()
                        if what == "record":
                            self._take(i, payload)
                        elif what == "done":
                            self._done.setdefault(i, payload)
                except (EOFError, OSError):
                    break
                if not p.is_alive() and not c.poll():
                    break
                await asyncio.sleep(0.02)
            if p.is_alive():
                p.kill()
            p.join(5)
            c.close()

    async def _serve(self, conns: list[multiprocessing.connection.Connection]) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

        def readable(i: int, conn: multiprocessing.connection.Connection) -> None:
            try:
                while conn.poll():
                    inbox.put_nowait((i, conn.recv()))
            except (EOFError, OSError):
                loop.remove_reader(conn.fileno())
                inbox.put_nowait((i, ("gone", None)))

        for i, c in enumerate(conns):
            loop.add_reader(c.fileno(), readable, i, c)
        ready: set[int] = set()
        live = set(range(len(conns)))
        deadline = loop.time() + self.start_timeout_s
        try:
            while live:
                timeout = deadline - loop.time() if self._measured_start is None else None
                try:
                    i, (what, payload) = await asyncio.wait_for(inbox.get(), timeout)
                except asyncio.TimeoutError:
                    raise RuntimeError(f"client processes not ready after {self.start_timeout_s:g} s "
                                       f"({len(ready)} of {len(conns)} ready)") from None
                if what == "record":
                    self._take(i, payload)
                elif what == "ready":
                    ready.add(i)
                    if len(ready) == len(conns):
                        start = perf_counter() + _START_MARGIN_S
                        self._host0 = host_cores()
                        self._measured_start = start - self.t0
                        for c in conns:
                            c.send(("start", start))
                        self._progress()
                elif what == "done":
                    self._done[i] = payload
                    live.discard(i)
                elif what == "error":
                    raise RuntimeError(f"client process {i} failed: {payload}")
                elif what == "gone":
                    if i in live:
                        raise RuntimeError(f"client process {i} exited before finishing its requests")
        finally:
            for c in conns:
                try:
                    loop.remove_reader(c.fileno())
                except (OSError, ValueError):
                    pass
        self._host_end = host_cores()
        # Each process's own reason says which bound it met; a quota this run gave it is not the
        # caller's max_requests.
        reasons = {m.get("stop_reason") for m in self._done.values()}
        self._stop_reason = ("duration" if "duration" in reasons
                             else "requests" if self.max_requests is not None else "exhausted")

    def _take(self, i: int, rec: RequestRecord) -> None:
        self.records.append(rec)
        self._proc_of.append(i)
        if rec.kind == "measured":
            self._phase_done += 1
            self._phase_errors += rec.status != "ok"
        if self.on_record is not None:
            self.on_record(rec)
        if rec.kind == "measured":
            self._progress()

    def _progress(self) -> None:
        if self.on_progress is None or self._measured_start is None:
            return
        total = self.max_requests
        if total is None and isinstance(self.requests, Sequence) and self.duration_s is None:
            total = len(self.requests)
        self.on_progress(Progress(
            phase="measured", done=self._phase_done, errors=self._phase_errors,
            in_flight=0, total=total, elapsed_s=perf_counter() - self.t0 - self._measured_start,
            duration_s=self.duration_s))

    def result(self) -> LoadResult:
        measured_ends = [r.t_end for r in self.records if r.kind == "measured" and r.t_end is not None]
        end = max(measured_ends) if measured_ends else (
            perf_counter() - self.t0 if self._measured_start is not None else None)
        import numpy as np  # here, not at the top: every servedeck command imports this module (--help included)

        procs = []
        for i in range(self.procs):
            meta = self._done.get(i, {})
            lags = [r.lag for r, p in zip(self.records, self._proc_of)
                    if p == i and r.kind == "measured" and r.lag is not None]
            cpu, wall, wait = meta.get("cpu_s"), meta.get("wall_s"), meta.get("wait_s")
            procs.append({
                "index": i, "streams": self._streams[i] if self._streams else None,
                "requests": sum(1 for r, p in zip(self.records, self._proc_of) if p == i and r.kind == "measured"),
                "cpu_s": cpu, "wall_s": wall, "cpu_fraction": cpu / wall if cpu is not None and wall else None,
                "wait_s": wait, "wait_fraction": wait / wall if wait is not None and wall else None,
                "lag_p99_ms": float(np.percentile(lags, 99)) * 1000 if lags else None,
                "loop": meta.get("loop"), "pid": meta.get("pid"), "gc": meta.get("gc"),
            })
        loops = sorted({p["loop"] for p in procs if p["loop"]})
        wall_s = (end - self._measured_start) if end is not None and self._measured_start is not None else 0.0
        cpu_s = sum(p["cpu_s"] or 0.0 for p in procs)
        return LoadResult(
            t0=self.t0,
            shape=dict(shape_json(self.shape), client_procs=self.procs),
            records=list(self.records),
            measured_start=self._measured_start,
            measured_end=end,
            cpu_s=cpu_s,
            wall_s=wall_s,
            stop_reason=self._stop_reason,
            loop="+".join(loops),
            procs=procs,
            host=host_use(self._host0, self._host_end, wall_s, cpu_s),
        )


def _process_cores(pid: int | None) -> None:
    """Let a client process run on every core this process may (its main thread's set), not only on the spawning
    thread's: a loop thread held to one busy core must not hold there the processes meant to relieve it."""
    try:
        cores = os.sched_getaffinity(os.getpid())
        if pid is not None and os.sched_getaffinity(pid) != cores:
            os.sched_setaffinity(pid, cores)
    except (AttributeError, OSError):  # no affinity here, or the process already ended: nothing to widen
        pass


# ---- the client process ---------------------------------------------------------------------------

def _child(conn: multiprocessing.connection.Connection, plan: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it tells us to stop
    try:
        run_loop(_child_main(conn, plan), plan["loop"])
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the run
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
    finally:
        conn.close()


async def _child_main(conn: multiprocessing.connection.Connection, plan: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    start: asyncio.Future[float] = loop.create_future()
    main = asyncio.current_task()
    assert main is not None
    stopped = False

    def readable() -> None:
        nonlocal stopped
        try:
            while conn.poll():
                what, payload = conn.recv()
                if what == "start" and not start.done():
                    start.set_result(payload)
                elif what == "stop":
                    stopped = True
                    main.cancel()
        except (EOFError, OSError):  # the parent is gone: stop
            stopped = True
            loop.remove_reader(conn.fileno())
            main.cancel()

    loop.add_reader(conn.fileno(), readable)

    async def gate() -> float:
        conn.send(("ready", None))
        return await start

    reqs = plan["requests"]
    if callable(reqs):  # every N-th request of this process's own copy of the source
        reqs = itertools.islice(reqs(), plan["index"], None, plan["procs"])
    async with StreamingClient(plan["config"]) as client:
        await client.prewarm(plan["prewarm"])
        run = LoadRun(client, plan["shape"], reqs, warmup=plan["warmup"], max_requests=plan["max_requests"],
                      duration_s=plan["duration_s"], on_record=lambda r: conn.send(("record", r)),
                      t0=plan["t0"], start_gate=gate, offsets=plan["offsets"], quiet_gc=plan["quiet_gc"])
        try:
            res = await run.run()
        except asyncio.CancelledError:
            if not stopped:
                raise
            res = run.result()
        loop.remove_reader(conn.fileno())
        conn.send(("done", {"cpu_s": res.cpu_s, "wall_s": res.wall_s, "wait_s": res.wait_s, "loop": current_loop(),
                            "stop_reason": res.stop_reason, "pid": os.getpid(), "gc": res.gc}))
