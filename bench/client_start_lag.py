"""How late each client process's first measured request goes out (issue 47): on an H100 host, 2026-12-06, every
client process's first request was 54-62 ms late (psutil imported after the measured clock started), which made
`--client-procs` points client-bound. Runs ProcessLoadRun over the measuring instrument (a server that emits
tokens at known times, not an engine) at a few (processes, concurrency) pairs, REPS times each.

    .venv/bin/python bench/client_start_lag.py [--reps 3] [--out bench/results/client_start_lag.json]

Prints, per pair, the median over reps of: the worst lag among the first request of each stream, and the worst
lag among every other measured request (ms). --before-tree PATH runs the same from another checkout's src/
(e.g. `git worktree add /tmp/before COMMIT`) in a subprocess, after this one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path

PAIRS = [(1, 1), (2, 2), (4, 8), (8, 32)]


def measure(reps: int) -> list[dict]:
    from servedeck.loadgen import ClientConfig, ClosedLoop, synthetic_requests
    from servedeck.loadgen.procs import ProcessLoadRun
    from servedeck.testing.instrument_process import InstrumentProcess

    inst = InstrumentProcess("--ttft-ms", "20", "--itl-ms", "2", "--tokens", "64", "--realistic")
    rows = []
    try:
        for procs, c in PAIRS:
            first, rest = [], []
            for rep in range(reps):
                req = partial(synthetic_requests, 128, 64, nonce=f"lag{procs}x{c}r{rep}")
                run = ProcessLoadRun(ClientConfig(inst.url, model="instrument"), ClosedLoop(c), req, procs=procs,
                                     duration_s=1.5)
                res = asyncio.run(run.run())
                m = sorted((r for r in res.records if r.kind == "measured" and r.t_send is not None),
                           key=lambda r: r.t_target)
                start = min(r.t_target for r in m)
                lag = [(r.t_send - r.t_target) * 1000 for r in m]
                first.append(max(x for r, x in zip(m, lag) if r.t_target - start < 1e-9))
                rest.append(max((x for r, x in zip(m, lag) if r.t_target - start >= 1e-9), default=0.0))
            rows.append({"procs": procs, "concurrency": c, "reps": reps,
                         "first_wave_worst_ms": round(statistics.median(first), 2),
                         "later_worst_ms": round(statistics.median(rest), 2)})
    finally:
        inst.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before-tree")
    ap.add_argument("--out", default="bench/results/client_start_lag.json")
    ap.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    rows = measure(a.reps)
    if a.json_only:
        print(json.dumps(rows))
        return
    result = {"load_average": os.getloadavg(), "now": rows}
    if a.before_tree:
        env = {**os.environ, "PYTHONPATH": str(Path(a.before_tree) / "src")}
        out = subprocess.run([sys.executable, __file__, "--reps", str(a.reps), "--json-only"], env=env,
                             capture_output=True, text=True, check=True).stdout
        result["before"] = json.loads(out.strip().splitlines()[-1])
    print(f"{'tree':>6} {'procs':>5} {'C':>4} {'first wave worst ms':>20} {'later worst ms':>15}")
    for tree in ("now", "before"):
        for r in result.get(tree, []):
            print(f"{tree:>6} {r['procs']:>5} {r['concurrency']:>4} {r['first_wave_worst_ms']:>20.1f} "
                  f"{r['later_worst_ms']:>15.1f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"→ {a.out}")


if __name__ == "__main__":
    main()
