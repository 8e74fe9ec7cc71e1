"""What the door's read callback costs per request, now and against an older copy of door/front.py.

One client connection (`front.Conn`) over a transport that takes every byte, each request arriving in
a read of its own (as a keep-alive client sends them), answered at once by a handler that writes a
small whole answer (`respond_body`): the callback's own work, parsing, the limits' bookkeeping, the
answer's head, without sockets, the event loop, routing or the relay. CPU time (process_time, not
wall: a busy host stretches wall time, not instructions), interleaved, the min of --reps.

    .venv/bin/python bench/front_cost.py [--baseline OLD_FRONT_PY] [--out bench/results/front_cost.json]
    # the front before issue 36's limits:  git show fc30aa6:src/servedeck/door/front.py > /tmp/front_old.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent

BODY = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "Say hi " * 40}],
                   "max_tokens": 64, "stream": True}).encode()
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAuthorization: Bearer bench-key-123\r\n"
           b"User-Agent: OpenAI/Python 1.50.0\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))


class Transport:
    def __init__(self) -> None:
        self.n = 0

    def set_write_buffer_limits(self, high: int, low: int) -> None: ...
    def get_extra_info(self, name: str):
        return ("127.0.0.1", 5555) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.n += len(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


class Handler:
    def admit(self, r):
        return None

    def handle(self, r) -> None:
        r.respond_body(200, b"application/json", b'{"ok": true}')

    def ended(self, r, ex) -> None: ...
    def failed(self, r, ex, exc) -> None: ...
    def gone(self, r) -> None: ...


class FrontStub:
    def __init__(self) -> None:
        self.conns: set = set()


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def per_request_us(front: ModuleType, n: int) -> float:
    c = front.Conn(Handler(), FrontStub())
    c.connection_made(Transport())
    t0 = time.process_time()
    for _ in range(n):
        c.data_received(REQUEST)
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, help="an older door/front.py to time beside this one")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "front_cost.json")
    a = ap.parse_args()
    fronts = {"now": load(HERE.parent / "src" / "servedeck" / "door" / "front.py", "front_now")}
    if a.baseline:
        fronts["baseline"] = load(a.baseline, "front_baseline")
    times: dict[str, list[float]] = {k: [] for k in fronts}
    for _ in range(a.reps):
        for k, f in fronts.items():
            times[k].append(per_request_us(f, a.requests))
    best = {k: min(v) for k, v in times.items()}
    print(f"{len(REQUEST)}-byte request, one read each, answered at once; min of {a.reps} × {a.requests:,}:")
    for k, v in best.items():
        print(f"  {k:>8}: {v:.2f} µs/request CPU  (all reps: {', '.join(f'{x:.2f}' for x in times[k])})")
    if "baseline" in best:
        print(f"  now − baseline: {best['now'] - best['baseline']:+.2f} µs/request")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"request_bytes": len(REQUEST), "requests": a.requests, "reps": a.reps,
                                 "us_per_request": times, "min_us": best, "baseline": str(a.baseline or ""),
                                 "python": platform.python_version(), "load_avg": os.getloadavg()}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
