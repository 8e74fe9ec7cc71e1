"""The door's own CPU per request: the timing instrument streams near-empty answers (2 tokens, no
waiting) through `servedeck serve --upstream`, and each process's CPU time (user + system, psutil) is
divided by the requests served. Per-request work (parsing, routing, the response head, the end) then
dominates; the instrument's figure is what a minimal server spends on the same request.

    .venv/bin/python bench/door_cpu.py [--concurrency 16] [--requests 3000] [--reps 3] [--out PATH]

Prints one row per rep and the median; writes JSON (bench/results/door_cpu.json by default). Another
checkout's door, for a before/after: PYTHONPATH=/path/to/that/checkout/src (the door process inherits it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import psutil
from door_latency import DoorProcess, drive

import servedeck
from servedeck.loadgen import summarize_run
from servedeck.loadgen.loop import run as run_loop
from servedeck.testing.instrument_process import InstrumentProcess

HERE = Path(__file__).resolve().parent


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "door_cpu.json")
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    inst = InstrumentProcess("--ttft-ms", "0", "--itl-ms", "0", "--tokens", "2")
    door = None
    rows = []
    try:
        door = DoorProcess("", "--upstream", f"instrument={inst.url}")
        pd, pi = psutil.Process(door.proc.pid), psutil.Process(inst.proc.pid)
        run_loop(drive(door.url, "instrument", a.concurrency, 200, 2, 16))  # warm: imports, pools
        for rep in range(a.reps):
            d0, i0, la0 = cpu_s(pd), cpu_s(pi), os.getloadavg()[0]
            res = run_loop(drive(door.url, "instrument", a.concurrency, a.requests, 2, 16))
            d1, i1 = cpu_s(pd), cpu_s(pi)
            st = summarize_run(res)
            n = st["counts"]["ok"] or 1
            row = {"rep": rep, "ok": st["counts"]["ok"], "errors": st["counts"]["error"],
                   "door_us_per_request": (d1 - d0) / n * 1e6, "instrument_us_per_request": (i1 - i0) / n * 1e6,
                   "load_avg_before": la0}
            rows.append(row)
            print(f"rep {rep}: {row['ok']} ok, door {row['door_us_per_request']:.0f} µs/request, "
                  f"instrument {row['instrument_us_per_request']:.0f} µs/request (load {la0:.1f})")
    finally:
        if door:
            door.stop()
        inst.stop()  # also when the door did not start
    med = {k: float(np.median([r[k] for r in rows])) for k in ("door_us_per_request", "instrument_us_per_request")}
    print(f"median: door {med['door_us_per_request']:.0f} µs/request, "
          f"instrument {med['instrument_us_per_request']:.0f} µs/request")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "tool": "bench/door_cpu.py", "argv": vars(a) | {"out": str(a.out)},
        "started": started,
        "platform": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "servedeck_src": str(Path(servedeck.__file__).parent),  # which checkout's door ran (PYTHONPATH)
        "rows": rows, "median": med}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
