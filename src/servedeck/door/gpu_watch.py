"""The GPUs on the door's page and in /door/status: the telemetry sampler's own source and conversion
(telemetry/live.py: NVML, or SERVEDECK_TELEMETRY_GPU_REPLAY's capture), read in one thread at most
once a second, never on a request's path. The page and /door/status read the last round only.

It starts with the first page or status request (a door nobody watches reads no GPU) and stops with
the door. Where no GPU can be read it says so once ("no GPU sampled: <why>") and reads nothing more."""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from servedeck.errors import ServedeckError
from servedeck.telemetry.live import gpu_source
from servedeck.telemetry.nvml_source import GpuSource, GpuUnavailable
from servedeck.telemetry.sampler import gpu_line

EVERY_S = 1.0
PENDING = "the first reading is being taken (the GPU watch starts with the first page or status request)"


class GpuWatch:
    def __init__(self, every_s: float = EVERY_S, source: Optional[GpuSource] = None) -> None:
        self.every_s = every_s
        self._source = source
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._gpus: list[dict[str, Any]] = []
        self._note: Optional[str] = None
        self._error: Optional[str] = None
        self._rounds = 0

    def now(self) -> dict[str, Any]:
        """The last round: {"every_s", "gpus": [...]} or {"every_s", "not_sampled": why}. Starts the thread."""
        self._start()
        with self._lock:
            if self._note is not None:
                return {"every_s": self.every_s, "not_sampled": self._note}
            if self._rounds == 0:  # the watch starts with the first request: say so rather than show no GPU
                return {"every_s": self.every_s, "gpus": [], "pending": PENDING}
            return {"every_s": self.every_s, "gpus": list(self._gpus), "last_error": self._error}

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="door-gpu-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            src = self._source or gpu_source()
            gpus = src.open(None)
        except (GpuUnavailable, ServedeckError) as e:
            with self._lock:
                self._note = f"no GPU sampled: {e}"
            return
        try:
            start, k = time.monotonic(), 0
            while not self._stop.is_set():
                self._round(src, gpus)
                k += 1
                self._stop.wait(max(0.0, start + k * self.every_s - time.monotonic()))
        finally:
            src.close()

    def _round(self, src: GpuSource, gpus: list[int]) -> None:
        rows, error = [], None
        for g in gpus:
            try:
                ln = gpu_line(src.read(g))
            except Exception as e:  # a read that fails says so on the page; the next round tries again
                error = f"GPU {g}: {e}"
                continue
            p, lim = ln["power_w"], ln["limit_w"]
            rows.append({"gpu": g, "power_w": p, "limit_w": lim,
                         "share_of_limit": round(p / lim, 4) if p is not None and lim else None,
                         "mem_used": ln["mem_used"], "mem_total": ln["mem_total"], "throttle": ln["throttle"]})
        with self._lock:
            self._gpus, self._error = rows, error
            self._rounds += 1

    def close(self) -> None:
        self._stop.set()
        th = self._thread
        if th is not None:
            th.join(5)
