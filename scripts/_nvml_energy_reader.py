"""An NVML reader independent of servedeck (pynvml only), for scripts/gpu-energy.sh's cross-check.

Every --interval seconds it writes, per GPU, one JSON line: `t` (time.monotonic(): CLOCK_MONOTONIC,
the clock servedeck's perf_counter reads on Linux) and the raw NVML fields in NVML's units, the format
servedeck.telemetry.nvml_source.RecordedSource replays (so the capture is also a recorded input for
tests). The first line is {"clock": ..., "wall": time.time(), "t": time.monotonic()}, to map
nvidia-smi's wall-clock timestamps onto the same clock. Stops on SIGTERM/SIGINT.

    python3 scripts/_nvml_energy_reader.py OUT.jsonl [--gpus 0,1] [--interval 0.05]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gpus", default="")
    ap.add_argument("--interval", type=float, default=0.05)
    a = ap.parse_args()
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception as e:  # no library or no driver: nothing to cross-check against
        print(f"energy reader: NVML cannot be read here: {e}", file=sys.stderr)
        return 2
    gpus = [int(g) for g in a.gpus.split(",") if g.strip()] or list(range(nv.nvmlDeviceGetCount()))
    handles = {g: nv.nvmlDeviceGetHandleByIndex(g) for g in gpus}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))

    def maybe(fn, *args):
        try:
            return fn(*args)
        except nv.NVMLError:
            return None

    with open(a.out, "w") as fh:
        fh.write(json.dumps({"clock": "CLOCK_MONOTONIC", "wall": time.time(), "t": time.monotonic()}) + "\n")
        nxt = time.monotonic()
        while not stop:
            for g, h in handles.items():
                t = time.monotonic()
                fh.write(json.dumps({"t": round(t, 6), "gpu": g,
                                     "energy_mj": maybe(nv.nvmlDeviceGetTotalEnergyConsumption, h),
                                     "power_mw": maybe(nv.nvmlDeviceGetPowerUsage, h),
                                     "limit_mw": maybe(nv.nvmlDeviceGetEnforcedPowerLimit, h)}) + "\n")
            fh.flush()
            nxt += a.interval
            time.sleep(max(0.0, nxt - time.monotonic()))
    nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
