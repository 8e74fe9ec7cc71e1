"""Where a run happened: tool, engine and Python versions, the host, its GPUs.

Collected once when a run folder opens, so a summary read years later still says what produced it.
Nothing here may fail a run: a fact that cannot be read is recorded as missing, with why.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

import httpx
import psutil

from servedeck import __version__


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def host() -> dict[str, Any]:
    mem = psutil.virtual_memory()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {"hostname": socket.gethostname(), "os": platform.platform(), "machine": platform.machine(),
            "cpu_model": _cpu_model(), "cpus": os.cpu_count(), "cpus_usable": affinity,
            "mem_gib": round(mem.total / 2**30, 1), "load_avg": [round(x, 2) for x in os.getloadavg()]}


def gpus() -> dict[str, Any]:
    """The NVML inventory when the gpu package and a driver are present; why not otherwise."""
    try:
        from servedeck.gpu import nvml
    except ImportError as e:  # the gpu package is optional in a stripped install
        return {"available": False, "reason": f"servedeck.gpu.nvml not importable: {e}"}
    try:
        return nvml.inventory().to_json()
    except Exception as e:  # NVML misbehaving must not cost the run
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}


def engine_version(base_url: str, engine: str, boot: dict[str, Any]) -> str | None:
    """The engine's own word on its version (where its adapter says a server states it), else the boot log."""
    from servedeck.engines import get_engine

    where = get_engine(engine).version_path
    if where is not None:
        path, key = where
        try:
            v = httpx.get(base_url.rstrip("/") + path, timeout=5).json().get(key)
            if v:
                return str(v)
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    return boot.get("engine_version")


def versions(base_url: str, engine: str, boot: dict[str, Any], build: Any = None) -> dict[str, Any]:
    """Tool and engine versions; the engine's adapter has the last word (a build may know more than
    its server says: llama.cpp from the sdist reports b0-unknown)."""
    from servedeck.engines import get_engine

    stated = engine_version(base_url, engine, boot)
    return {"servedeck": __version__, "python": sys.version.split()[0],
            "python_impl": platform.python_implementation(), "engine": engine,
            "engine_version": get_engine(engine).version(build, stated)}
