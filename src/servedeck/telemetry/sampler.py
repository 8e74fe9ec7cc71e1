"""The sampler beside a measured point: one thread per source (the engine's /metrics, the GPUs'
NVML), each on a fixed schedule (start + k × interval), appending one line per sample to
telemetry.jsonl the moment it is taken, so whatever stops the run keeps what was sampled.

A thread, not a task on the client's event loop: a slow /metrics answer or NVML call then delays
the next sample, never a request. A sample that takes longer than the interval makes the ticks it
overran count as `missed` (said in the point), and the schedule goes on from the next tick.

Lines (every one carries `t`, time.perf_counter() seconds: the client's monotonic clock, the one
requests.jsonl's times are relative to through the point's t0, and `point`):
    {"source": "engine", "kind": "start", "series": {...}, "interval_s": 1.0, "replicas": [...]}
    {"source": "engine", "kind": "sample", "replica": 0, "kv_usage": .., "running": .., "waiting": ..,
     ..., "read_ms": 3.1}
    {"source": "gpu", "kind": "start", "gpus": [0], "interval_s": 0.2, "xid_note": ...}
    {"source": "gpu", "kind": "sample", "gpu": 0, "power_w": .., "energy_j": .., "limit_w": .., ...}
    {"source": "gpu", "kind": "xid", "gpu": 0, "xid": 79}
    {"source": S, "kind": "unavailable", "reason": "..."}     nothing of S sampled, and why
    {"source": S, "kind": "end", "samples": n, "missed": m, "errors": e, "last_error": .., "cpu_s": ..}
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

from servedeck.errors import UsageError
from servedeck.errors import DiskFullError
from servedeck.fsio import append_jsonl
from servedeck.telemetry.nvml_source import GpuSource, GpuUnavailable, reason_names
from servedeck.telemetry.series import read_series

FILE = "telemetry.jsonl"


@dataclass(frozen=True)
class Settings:
    """How often each source is read. SERVEDECK_TELEMETRY=off turns the sampler off (the point then
    says so); SERVEDECK_TELEMETRY_ENGINE_S / SERVEDECK_TELEMETRY_GPU_S set the intervals."""

    enabled: bool = True
    engine_interval_s: float = 1.0
    gpu_interval_s: float = 0.2

    @classmethod
    def from_env(cls) -> "Settings":
        on = os.environ.get("SERVEDECK_TELEMETRY", "on").strip().lower()
        if on not in ("on", "off", "1", "0", "true", "false", ""):
            raise UsageError(f"SERVEDECK_TELEMETRY={on!r} is not on or off",
                             hint="unset it (telemetry on) or set SERVEDECK_TELEMETRY=off")
        return cls(enabled=on not in ("off", "0", "false"),
                   engine_interval_s=_seconds("SERVEDECK_TELEMETRY_ENGINE_S", 1.0, 0.1, 60.0),
                   gpu_interval_s=_seconds("SERVEDECK_TELEMETRY_GPU_S", 0.2, 0.05, 10.0))


def _seconds(var: str, default: float, low: float, high: float) -> float:
    raw = os.environ.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not low <= v <= high:
        raise UsageError(f"{var}={raw!r} is not a number of seconds between {low:g} and {high:g}",
                         hint=f"unset it for the default ({default:g} s)")
    return v


class _Schedule(threading.Thread):
    """One source on a fixed schedule. `take()` writes its own lines; a raise counts as an error."""

    def __init__(self, name: str, interval_s: float, take: Callable[[], None], stop: threading.Event):
        super().__init__(name=f"servedeck-telemetry-{name}", daemon=True)
        self.interval_s, self.take, self.stop = interval_s, take, stop
        self.samples = self.missed = self.errors = 0
        self.last_error: Optional[str] = None
        self.cpu_s = 0.0

    def run(self) -> None:
        cpu0 = time.thread_time()
        start, k = time.perf_counter(), 0
        try:
            while not self.stop.is_set():
                try:
                    self.take()
                    self.samples += 1
                except Exception as e:  # a failed read is counted and named; sampling goes on
                    self.errors += 1
                    self.last_error = f"{type(e).__name__}: {e}"[:300]
                k += 1
                now = time.perf_counter()
                late = int((now - (start + k * self.interval_s)) // self.interval_s) + 1
                if late > 0:  # this sample overran `late` ticks: missed, and the schedule skips them
                    self.missed += late
                    k += late
                self.stop.wait(max(0.0, start + k * self.interval_s - now))
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def facts(self) -> dict[str, Any]:
        return {"samples": self.samples, "missed": self.missed, "errors": self.errors,
                "last_error": self.last_error, "cpu_s": round(self.cpu_s, 6)}


class EngineReader:
    """The engine's /metrics, read through one kept-alive connection per replica."""

    def __init__(self, base_urls: list[str], names: dict[str, str], timeout_s: float):
        self.urls = [u.rstrip("/") + "/metrics" for u in base_urls]
        self.names = names
        self.http = httpx.Client(timeout=timeout_s)
        self.absent: dict[int, list[str]] = {}

    def first_problem(self) -> Optional[str]:
        """Why nothing can be sampled (no series named, no /metrics page, none of the series on it),
        asked once before sampling starts; None when the first replica's page answers."""
        if not self.names:
            return "the engine's adapter names no /metrics series for telemetry"
        try:
            r = self.http.get(self.urls[0])
        except httpx.HTTPError as e:
            return f"GET {self.urls[0]} failed: {type(e).__name__}: {e}"
        if r.status_code != 200:
            return (f"GET {self.urls[0]} answered {r.status_code}: the engine serves no /metrics "
                    "(llama-server needs --metrics, which servedeck renders unless args turn it off)")
        got, _ = read_series(r.text, self.names)
        if not got:
            return f"{self.urls[0]} carries none of the series {sorted(self.names.values())}"
        return None

    def take(self, write: Callable[[dict[str, Any]], None]) -> None:
        for i, url in enumerate(self.urls):
            t_ask = time.perf_counter()
            r = self.http.get(url)
            t_got = time.perf_counter()
            r.raise_for_status()
            values, absent = read_series(r.text, self.names)
            line: dict[str, Any] = {"t": round((t_ask + t_got) / 2, 6), "source": "engine", "kind": "sample",
                                    "replica": i, **values, "read_ms": round((t_got - t_ask) * 1000, 3)}
            if absent and self.absent.get(i) != absent:  # said once, and again if it changes
                self.absent[i] = absent
                line["absent"] = absent
            write(line)

    def close(self) -> None:
        self.http.close()


class GpuReader:
    """Each GPU's raw NVML reading → one line in servedeck's units (W, J, bytes, %, MHz)."""

    def __init__(self, source: GpuSource, gpus: list[int]):
        self.source, self.gpus = source, gpus

    def take(self, write: Callable[[dict[str, Any]], None]) -> None:
        for g in self.gpus:
            t = time.perf_counter()
            raw = self.source.read(g)
            write({"t": round(t, 6), "source": "gpu", "kind": "sample", "gpu": g, **gpu_line(raw)})
        for ev in self.source.xids():
            write({"t": round(time.perf_counter(), 6), "source": "gpu", "kind": "xid", **ev})


def gpu_line(raw: dict[str, Any]) -> dict[str, Any]:
    """A raw NVML reading (nvml_source.py's units) in servedeck's."""
    def div(key: str, by: float) -> Optional[float]:
        v = raw.get(key)
        return None if v is None else round(v / by, 3)

    return {"power_w": div("power_mw", 1000), "energy_j": div("energy_mj", 1000), "limit_w": div("limit_mw", 1000),
            "mem_used": raw.get("mem_used"), "mem_total": raw.get("mem_total"),
            "sm_util_pct": raw.get("sm_util"), "mem_util_pct": raw.get("mem_util"),
            "sm_clock_mhz": raw.get("sm_clock_mhz"), "mem_clock_mhz": raw.get("mem_clock_mhz"),
            "throttle": reason_names(raw.get("reasons")), "temp_c": raw.get("temp_c")}


class PointSampler:
    """States: ready → sampling (`start`) → stopped (`stop`, which returns the facts). Either source
    may be absent (None) or unavailable; then its `unavailable` line says why and the other goes on."""

    def __init__(self, path: Path, point: Any, *, engine: Optional[EngineReader],
                 gpu_source: Optional[GpuSource], gpus: Optional[list[int]], settings: Settings,
                 not_sampled: Optional[dict[str, str]] = None):
        self.path, self.point, self.settings = path, point, settings
        self.engine, self.gpu_source, self.gpus = engine, gpu_source, gpus
        self.not_sampled: dict[str, str] = dict(not_sampled or {})
        self._stop = threading.Event()
        self._threads: dict[str, _Schedule] = {}
        self._lock = threading.Lock()
        self.facts: dict[str, Any] = {}  # set by stop()
        self.state = "ready"
        self.unwritten, self.unwritten_why = 0, None  # lines a full disk had no room for

    def write(self, line: dict[str, Any]) -> None:
        line.setdefault("t", round(time.perf_counter(), 6))
        with self._lock:  # two threads, one file: a line is one write either way, the lock keeps order
            try:
                append_jsonl(self.path, {"point": self.point, **line}, fsync=False)
            except DiskFullError as e:  # beside the run, never its end: the run's own writes say the disk is full
                self.unwritten += 1
                self.unwritten_why = self.unwritten_why or e.message

    def start(self) -> None:
        if self.state != "ready":
            raise RuntimeError(f"PointSampler.start in state {self.state!r}; a sampler is single-use")
        self.state = "sampling"
        for source, why in self.not_sampled.items():
            self.write({"source": source, "kind": "unavailable", "reason": why})
        if self.engine is not None and "engine" not in self.not_sampled:
            problem = self.engine.first_problem()
            if problem:
                self._unavailable("engine", problem)
            else:
                self.write({"source": "engine", "kind": "start", "series": self.engine.names,
                            "interval_s": self.settings.engine_interval_s, "replicas": self.engine.urls})
                self._run("engine", self.settings.engine_interval_s, lambda: self.engine.take(self.write))
        if self.gpu_source is not None and "gpu" not in self.not_sampled:
            try:
                gpus = self.gpu_source.open(self.gpus)
            except GpuUnavailable as e:
                self._unavailable("gpu", str(e))
            else:
                reader = GpuReader(self.gpu_source, gpus)
                self.write({"source": "gpu", "kind": "start", "gpus": gpus, "interval_s": self.settings.gpu_interval_s,
                            "xid_note": getattr(self.gpu_source, "xid_note", None)})
                self._run("gpu", self.settings.gpu_interval_s, lambda: reader.take(self.write))

    def _unavailable(self, source: str, reason: str) -> None:
        self.not_sampled[source] = reason
        self.write({"source": source, "kind": "unavailable", "reason": reason})

    def _run(self, source: str, interval_s: float, take: Callable[[], None]) -> None:
        th = _Schedule(source, interval_s, take, self._stop)
        self._threads[source] = th
        th.start()

    def stop(self) -> dict[str, Any]:
        """Stop sampling (each thread finishes the sample it is taking); the facts, also written as `end` lines."""
        if self.state == "stopped":
            return self.facts
        self.state = "stopped"
        self._stop.set()
        for source, th in self._threads.items():
            th.join(timeout=30)
            self.write({"source": source, "kind": "end", **th.facts()})
        if self.engine is not None:
            self.engine.close()
        if self.gpu_source is not None:
            self.gpu_source.close()
        self.facts = {"file": self.path.name, "not_sampled": self.not_sampled,
                      **{s: th.facts() for s, th in self._threads.items()},
                      **({"unwritten": {"lines": self.unwritten, "why": self.unwritten_why}} if self.unwritten else {})}
        return self.facts
