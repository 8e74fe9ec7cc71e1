"""Where does servedeck's client spend its time at N streams? A profile under the box's own contention.

One closed-loop run (3 requests per stream, TTFT 50 ms, 20 ms per token, 100 tokens) against the
instrument in its own process, reporting what the client measured against what the instrument
wrote (TTFT error p50/p99), schedule lag, client CPU, and every garbage collection the client
ran during the measured phase: count and CPU time per generation (time.thread_time, so a descheduled process does not
inflate it), the longest single pause. --profile adds cProfile's top functions by own time.
--before-tree runs the client of another source tree (a git worktree) instead, for before/after figures:

    .venv/bin/python bench/profile_client.py --mode realistic --streams 256 [--loop uvloop] [--gc default]
    git worktree add /tmp/loadgen-before 33d2f12     # before issue 21's httptools framing
    .venv/bin/python bench/profile_client.py --mode realistic --before-tree /tmp/loadgen-before
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["cheap", "realistic", "spaced"], default="realistic")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    ap.add_argument("--gc", choices=["quiet", "default"], default="quiet")
    ap.add_argument("--profile", action="store_true", help="cProfile the client (slows it: figures then are not the client's)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--before-tree", type=Path, help="profile the servedeck client of this source tree instead")
    ap.add_argument("--json", type=Path, help="append the figures as one JSON line to this file")
    a = ap.parse_args()
    if a.before_tree:  # before anything imports servedeck
        sys.path.insert(0, str(a.before_tree.resolve() / "src"))

    import numpy as np

    from servedeck.loadgen import ClientConfig, ClosedLoop, StreamingClient, run_load, summarize_run, synthetic_requests
    from servedeck.loadgen.loop import run as run_loop
    from servedeck.testing.instrument_process import InstrumentProcess

    mode_args = {"cheap": [], "realistic": ["--realistic"], "spaced": ["--realistic", "--json-spaces"]}[a.mode]
    inst = InstrumentProcess("--ttft-ms", "50", "--itl-ms", "20", "--tokens", "100", *mode_args)
    pauses: list[tuple[int, float, float]] = []  # (generation, perf_counter at start, CPU seconds)
    started = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
        else:
            pauses.append((info["generation"], started[0], time.thread_time() - started[1]))

    async def drive() -> Any:
        specs = list(synthetic_requests(64, 100, n=a.streams * a.rounds))
        warm = list(synthetic_requests(64, 4, n=8, kind="warmup"))
        async with StreamingClient(ClientConfig(inst.url, model="instrument")) as c:
            await c.prewarm(a.streams + 1)
            pauses.clear()  # set-up is not the run
            return await run_load(c, ClosedLoop(a.streams), specs, warmup=warm, quiet_gc=a.gc == "quiet")

    prof = cProfile.Profile() if a.profile else None
    gc.callbacks.append(on_gc)
    try:
        inst.clear()
        if prof:
            prof.enable()
        res = run_loop(drive(), None if a.loop == "auto" else a.loop)
        if prof:
            prof.disable()
        sent = inst.records()
    finally:
        gc.callbacks.remove(on_gc)
        inst.stop()
    errs = [(r.chunk_t[0] + res.t0 - sent[r.id]["chunk_t"][0]) * 1e3 for r in res.records
            if r.kind == "measured" and r.status == "ok" and r.chunk_t and r.id in sent]
    st = summarize_run(res)
    # Only what ran while the measured phase did (warm-up and set-up collections are not lag).
    lo, hi = res.t0 + (res.measured_start or 0.0), res.t0 + (res.measured_end or 0.0)
    by_gen = {g: [d * 1e3 for x, t, d in pauses if x == g and lo <= t <= hi] for g in (0, 1, 2)}
    out = {
        "mode": a.mode, "streams": a.streams, "loop": res.loop, "gc": a.gc, "client_tree": str(a.before_tree or "current"),
        "ttft_err_p50_ms": float(np.percentile(errs, 50)), "ttft_err_p99_ms": float(np.percentile(errs, 99)),
        "lag_p99_ms": st["client"]["lag_ms"]["p99"], "client_cpu_fraction": st["client"]["cpu_fraction"],
        "gc_collections": {g: len(v) for g, v in by_gen.items()},
        "gc_cpu_ms": {g: round(sum(v), 2) for g, v in by_gen.items()},
        "gc_longest_ms": {g: round(max(v, default=0.0), 2) for g, v in by_gen.items()},
        "load_avg_1m": os.getloadavg()[0], "profiled": a.profile,
    }
    print(f"{a.mode} instrument, {a.streams} streams, loop {res.loop}, gc {a.gc}, client {out['client_tree']}: "
          f"TTFT error p50 {out['ttft_err_p50_ms']:.2f} ms, p99 {out['ttft_err_p99_ms']:.2f} ms; lag p99 "
          f"{out['lag_p99_ms']:.1f} ms; client CPU {out['client_cpu_fraction']:.0%}; load {out['load_avg_1m']:.1f}")
    print(f"GC during the measured phase: collections {out['gc_collections']}, CPU ms {out['gc_cpu_ms']}, "
          f"longest ms {out['gc_longest_ms']}")
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(a.top)
        print(buf.getvalue())
    if a.json:
        with a.json.open("a") as f:
            f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
