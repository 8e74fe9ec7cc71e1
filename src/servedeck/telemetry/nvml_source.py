"""Where the GPU sampler's readings come from: NVML itself (nvidia-ml-py's pynvml), or a capture of
NVML readings replayed (tests on a host without a GPU; scripts/gpu-energy.sh writes real captures).

A source speaks NVML's own units, one raw reading per GPU per call:

    power_mw        nvmlDeviceGetPowerUsage (on Hopper a 1-s average, not an instant)
    energy_mj       nvmlDeviceGetTotalEnergyConsumption: mJ since the driver loaded (Volta and later)
    limit_mw        nvmlDeviceGetEnforcedPowerLimit: the cap the card obeys now
    mem_used, mem_total               bytes (nvmlDeviceGetMemoryInfo)
    sm_util, mem_util                 % (nvmlDeviceGetUtilizationRates)
    sm_clock_mhz, mem_clock_mhz       nvmlDeviceGetClockInfo
    reasons         the clock-event (throttle) reason bitmask
    temp_c          nvmlDeviceGetTemperature
A field the board does not support is None. `xids()` returns the Xid events since the last call.
The sampler (sampler.py) turns a raw reading into a telemetry line; the units change only there.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Protocol


class GpuUnavailable(Exception):
    """No GPU can be read here; the message says why (no library, no driver, no such GPU)."""


class GpuSource(Protocol):
    def open(self, gpus: Optional[list[int]]) -> list[int]:
        """Start reading; the GPU indices read from now on (None: every GPU the source has)."""

    def read(self, index: int) -> dict[str, Any]:
        """One raw reading of one GPU, in NVML's units."""

    def xids(self) -> list[dict[str, Any]]:
        """Xid events since the last call: {"gpu": index, "xid": code}."""

    def close(self) -> None: ...


# clock-event reason bits (nvmlClocksEventReason*), named as nvidia-smi -q names them
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
           0x100: "display_clocks"}


def reason_names(mask: Optional[int]) -> Optional[list[str]]:
    if mask is None:
        return None
    return [name for bit, name in REASONS.items() if mask & bit]


class PynvmlSource:
    """The driver, through pynvml. open() raises GpuUnavailable with the reason when it cannot read."""

    def __init__(self) -> None:
        self._handles: dict[int, Any] = {}
        self._events: Any = None
        self.xid_note: Optional[str] = None  # why Xid events are not watched, when they are not

    def open(self, gpus: Optional[list[int]]) -> list[int]:
        try:
            import pynvml
        except ImportError:
            raise GpuUnavailable("nvidia-ml-py (pynvml) is not installed in servedeck's environment") from None
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise GpuUnavailable(f"no NVIDIA driver here (NVML: {e})") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
            wanted = list(range(count)) if gpus is None else list(gpus)
            if not wanted:
                raise GpuUnavailable("the NVIDIA driver is loaded but reports no GPUs")
            missing = [i for i in wanted if i >= count]
            if missing:
                raise GpuUnavailable(f"the launch names GPU(s) {missing} but NVML sees {count}")
            self._handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in wanted}
        except pynvml.NVMLError as e:
            self.close()
            raise GpuUnavailable(f"NVML failed while opening the GPUs: {e}") from None
        except GpuUnavailable:
            self.close()
            raise
        self._watch_xids()
        return wanted

    def _watch_xids(self) -> None:
        nv = self._nv
        try:
            self._events = nv.nvmlEventSetCreate()
            for h in self._handles.values():
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
        except nv.NVMLError as e:  # not supported on this board, or not permitted
            self._events, self.xid_note = None, f"Xid events not watched (NVML: {e})"

    def _maybe(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def read(self, index: int) -> dict[str, Any]:
        nv, h = self._nv, self._handles[index]
        mem = self._maybe(nv.nvmlDeviceGetMemoryInfo, h)
        util = self._maybe(nv.nvmlDeviceGetUtilizationRates, h)
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return {"power_mw": self._maybe(nv.nvmlDeviceGetPowerUsage, h),
                "energy_mj": self._maybe(nv.nvmlDeviceGetTotalEnergyConsumption, h),
                "limit_mw": self._maybe(nv.nvmlDeviceGetEnforcedPowerLimit, h),
                "mem_used": None if mem is None else int(mem.used),
                "mem_total": None if mem is None else int(mem.total),
                "sm_util": None if util is None else int(util.gpu),
                "mem_util": None if util is None else int(util.memory),
                "sm_clock_mhz": self._maybe(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": self._maybe(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "reasons": self._maybe(reasons_fn, h),
                "temp_c": self._maybe(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)}

    def xids(self) -> list[dict[str, Any]]:
        if self._events is None:
            return []
        nv, out = self._nv, []
        index_of = {id(h): i for i, h in self._handles.items()}
        while True:
            try:
                ev = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:  # NVMLError_Timeout: nothing pending
                return out
            gpu = self._maybe(nv.nvmlDeviceGetIndex, ev.device)
            out.append({"gpu": gpu if gpu is not None else index_of.get(id(ev.device)), "xid": int(ev.eventData)})

    def close(self) -> None:
        nv = getattr(self, "_nv", None)
        if nv is None:
            return
        if self._events is not None:
            self._maybe(nv.nvmlEventSetFree, self._events)
            self._events = None
        self._maybe(nv.nvmlShutdown)
        self._nv = None


def capture_readings(path: Path) -> list[dict[str, Any]]:
    """A capture's readings. scripts/_nvml_energy_reader.py opens its file with one clock line
    ({"clock": "CLOCK_MONOTONIC", "wall": ..., "t": ...}, no "gpu"), to map wall-clock tools onto its
    clock; that line is not a reading and is dropped here. Each reading's own "t" is kept (gpu_line
    ignores it; tests use it to put the capture on its own timeline)."""
    lines = [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
    return [ln for ln in lines if not ("clock" in ln and "gpu" not in ln)]


class RecordedSource:
    """NVML readings recorded earlier, replayed in order: a capture is JSON lines of raw readings
    {"gpu": index, ...NVML fields} (an "xid" line is an Xid event, played at its place), as
    scripts/gpu-energy.sh's `capture` writes them. Each GPU's readings play one per read and the last
    one repeats once they run out, so a replay never ends a sampler's point early."""

    def __init__(self, lines: list[dict[str, Any]]):
        self._by_gpu: dict[int, list[dict[str, Any]]] = {}
        self._pending_xids: dict[int, list[dict[str, Any]]] = {}
        for ln in lines:
            g = int(ln["gpu"])
            if "xid" in ln:
                self._pending_xids.setdefault(len(self._by_gpu.get(g, [])), []).append({"gpu": g, "xid": ln["xid"]})
            else:
                self._by_gpu.setdefault(g, []).append({k: v for k, v in ln.items() if k != "gpu"})
        self._next: dict[int, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path) -> "RecordedSource":
        return cls(capture_readings(path))

    def open(self, gpus: Optional[list[int]]) -> list[int]:
        have = sorted(self._by_gpu)
        wanted = have if gpus is None else list(gpus)
        missing = [g for g in wanted if g not in self._by_gpu]
        if missing or not wanted:
            raise GpuUnavailable(f"the recorded readings hold GPU(s) {have}, not {missing or wanted}")
        return wanted

    def read(self, index: int) -> dict[str, Any]:
        with self._lock:
            seq = self._by_gpu[index]
            k = self._next.get(index, 0)
            self._next[index] = k + 1
            return dict(seq[min(k, len(seq) - 1)])

    def xids(self) -> list[dict[str, Any]]:
        with self._lock:
            played = min(self._next.values(), default=0)
            due = [k for k in self._pending_xids if k < played]
            return [e for k in sorted(due) for e in self._pending_xids.pop(k)]

    def close(self) -> None:
        pass
