"""What the NVIDIA driver says about this host's GPUs, read through NVML (nvidia-ml-py's `pynvml`).

The one effectful entry point is `inventory()`. It never raises for "no GPU here": a host without
the driver, without the library or with zero devices gets `Inventory(available=False, reason=...)`,
so every caller (doctor rows, `servedeck gpu`, the deck's fit check) can say SKIP and why.
Everything else here is plain data that round-trips through JSON (tests build inventories by hand).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from servedeck.hostcpu import cpulist_text, numa_nodes, parse_cpulist

GiB = 1024**3


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on one GPU. `pid` is a host pid (NVML reports the host's pid namespace);
    `used_bytes` is None when the driver will not say (e.g. under some vGPU/MIG setups)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int
    memory_used: int
    memory_free: int
    power_w: float | None = None  # current draw
    power_limit_w: float | None = None  # enforced limit (what the card obeys now)
    power_default_limit_w: float | None = None
    power_range_w: tuple[float, float] | None = None  # what the driver allows the limit to be set to
    utilization_pct: int | None = None
    processes: tuple[GpuProcess, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["processes"] = [asdict(p) for p in self.processes]
        d["power_range_w"] = list(self.power_range_w) if self.power_range_w else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Gpu":
        d = dict(d)
        d["processes"] = tuple(GpuProcess(**p) for p in d.get("processes", ()))
        if d.get("power_range_w"):
            d["power_range_w"] = tuple(d["power_range_w"])
        return cls(**d)


@dataclass(frozen=True)
class Inventory:
    """All GPUs at one instant. `available` False means nothing could be read; `reason` says why."""

    available: bool
    gpus: tuple[Gpu, ...] = ()
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    read_at: float = field(default_factory=time.time)
    # the host's NUMA nodes and their CPUs (hostcpu.numa_nodes): a plan for this host renders its
    # containers' --cpuset-mems from them (`campaign plan --inventory`)
    numa: dict[int, list[int]] = field(default_factory=dict)

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def pids(self) -> set[int]:
        return {p.pid for g in self.gpus for p in g.processes}

    def to_json(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "read_at": self.read_at,
            "gpus": [g.to_json() for g in self.gpus],
            "numa": {str(n): cpulist_text(cpus) for n, cpus in sorted(self.numa.items())},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Inventory":
        return cls(
            available=d["available"],
            gpus=tuple(Gpu.from_json(g) for g in d.get("gpus", ())),
            reason=d.get("reason"),
            driver_version=d.get("driver_version"),
            cuda_driver_version=d.get("cuda_driver_version"),
            read_at=d.get("read_at", 0.0),
            numa={int(n): parse_cpulist(c) if isinstance(c, str) else list(c) for n, c in (d.get("numa") or {}).items()},
        )


def unavailable(reason: str) -> Inventory:
    return Inventory(available=False, reason=reason)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _maybe(fn, *args, default=None):
    """Optional NVML queries (power on some boards, utilisation under MIG) fail per device; one
    unsupported field must not hide the rest of the inventory."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return default


def _processes(pynvml, handle) -> tuple[GpuProcess, ...]:
    procs = _maybe(pynvml.nvmlDeviceGetComputeRunningProcesses, handle, default=[]) or []
    out: dict[int, GpuProcess] = {}
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        # NVML reports "not available" as a huge sentinel on some drivers (NVML_VALUE_NOT_AVAILABLE).
        if used is not None and used >= 2**63:
            used = None
        prev = out.get(p.pid)
        if prev and prev.used_bytes is not None and used is not None:
            used += prev.used_bytes  # a process can appear once per context (MPS); add them up
        out[p.pid] = GpuProcess(pid=int(p.pid), used_bytes=used)
    return tuple(out.values())


def _read_device(pynvml, index: int) -> Gpu:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    power = _maybe(pynvml.nvmlDeviceGetPowerUsage, h)
    limit = _maybe(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    default_limit = _maybe(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h)
    constraints = _maybe(pynvml.nvmlDeviceGetPowerManagementLimitConstraints, h)
    util = _maybe(pynvml.nvmlDeviceGetUtilizationRates, h)
    pci = _maybe(pynvml.nvmlDeviceGetPciInfo, h)

    def mw(v: Optional[float]) -> Optional[float]:  # NVML speaks milliwatts
        return None if v is None else round(v / 1000.0, 1)

    return Gpu(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(h)),
        uuid=_text(_maybe(pynvml.nvmlDeviceGetUUID, h, default="")),
        pci_bus_id=_text(pci.busId) if pci is not None else "",
        memory_total=int(mem.total),
        memory_used=int(mem.used),
        memory_free=int(mem.free),
        power_w=mw(power),
        power_limit_w=mw(limit),
        power_default_limit_w=mw(default_limit),
        power_range_w=(mw(constraints[0]), mw(constraints[1])) if constraints else None,
        utilization_pct=int(util.gpu) if util is not None else None,
        processes=_processes(pynvml, h),
    )


def inventory() -> Inventory:
    """Read every GPU now, and the host's NUMA nodes. Never raises for a host without GPUs: the result
    says why instead."""
    from dataclasses import replace

    return replace(_gpus(), numa=numa_nodes())


def _gpus() -> Inventory:
    try:
        import pynvml
    except ImportError:
        return unavailable("nvidia-ml-py (pynvml) is not installed in servedeck's environment")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        # LibraryNotFound: no driver installed; DriverNotLoaded: installed but no kernel module / device.
        return unavailable(f"no NVIDIA driver here (NVML: {e})")
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return unavailable("the NVIDIA driver is loaded but reports no GPUs")
        gpus = tuple(_read_device(pynvml, i) for i in range(count))
        driver = _text(_maybe(pynvml.nvmlSystemGetDriverVersion, default="")) or None
        cuda = _maybe(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_s = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        return Inventory(available=True, gpus=gpus, driver_version=driver, cuda_driver_version=cuda_s)
    except pynvml.NVMLError as e:
        return unavailable(f"NVML failed while reading the GPUs: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def gib(n: int | float | None) -> str:
    """Bytes as the seed writes them: '93.5 GiB' (and '235 MiB' below a GiB, where one decimal of GiB says little)."""
    if n is None:
        return "?"
    return f"{n / GiB:.1f} GiB" if abs(n) >= GiB else f"{n / 1024**2:.0f} MiB"
