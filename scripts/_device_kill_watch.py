"""Run by scripts/gpu-vllm.sh while `servedeck watch` runs: SIGKILL a vLLM model's EngineCore, wait until the
watch loop has it ready again under a new engine, then the same for its API server. What was killed, and how
long until it answered again, to OUT.json.

    python _device_kill_watch.py MODEL OUT.json [--timeout 150]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from servedeck.deck import state as S


def ready_again(model: str, old_engine: int) -> bool:
    rec = S.read_live(model)
    return rec is not None and str(rec.state) == "ready" and rec.engine_pid not in (None, old_engine)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--timeout", type=float, default=150.0)
    args = ap.parse_args()
    out = []
    for what in ("EngineCore", "API server"):
        rec = S.read_live(args.model)
        if rec is None or rec.engine_pid is None:
            out.append({"killed": what, "error": f"{args.model} is not running"})
            break
        api = psutil.Process(rec.engine_pid)
        victims = [api] if what == "API server" else \
            [p for p in api.children(recursive=True) if "EngineCore" in p.name() + " ".join(p.cmdline())]
        if not victims:
            out.append({"killed": what, "error": "no such process under the engine"})
            continue
        t = time.monotonic()
        for v in victims:
            os.kill(v.pid, signal.SIGKILL)
        while not ready_again(args.model, rec.engine_pid) and time.monotonic() - t < args.timeout:
            time.sleep(0.5)
        back = round(time.monotonic() - t, 1)
        ok = ready_again(args.model, rec.engine_pid)
        status = subprocess.run([sys.executable, "-m", "servedeck", "status", "--json"], capture_output=True, text=True)
        out.append({"killed": what, "pids": [v.pid for v in victims], "back_after_s": back, "ready": ok,
                    "status": json.loads(status.stdout or "[]")})
        print(f"{what} (pids {[v.pid for v in victims]}) SIGKILLed: "
              + (f"ready again after {back} s" if ok else f"not ready after {back} s"), flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
