"""Waiting for GPU memory after a stop: the driver frees a process's memory some time after it exits,
so a switch that started the next model at once would find the card still full. Both waits are
bounded and return None on a host without a GPU."""

from __future__ import annotations

import time
from typing import Optional

from servedeck.config import Config
from servedeck.deck import state as S


def wait_for_memory(name: str, cfg: Config, timeout_s: float = 120.0) -> Optional[float]:
    """After stopping what held the GPUs: the driver frees a process's memory some time after it
    exits. Wait (bounded) until `name` fits; None on a host without a GPU. The launch's own fit
    check then refuses, naming the holder, if it still does not."""
    from servedeck.gpu.fit import wait_for_fit

    def told(report, waited_s: float) -> None:
        if waited_s == 0 or int(waited_s) % 10 == 0:
            S.journal("switch", name, "waiting-for-memory", waited_s=round(waited_s, 2), detail=report.message())

    report, waited = wait_for_fit(cfg, name, timeout_s=timeout_s, on_wait=told)
    return None if report.status == "unknown" else round(waited, 3)


def wait_gpu_released(pids: set[int], timeout_s: float = 120.0) -> dict | None:
    """On a GPU host, wait until NVML no longer lists any process of the stopped group.

    The driver frees memory after the process is reaped, and not always at once: a switch that
    started the next model earlier would find the card still full. None when there is no GPU.
    """
    from servedeck.gpu import nvml

    t0 = time.monotonic()
    inv = nvml.inventory()
    if not inv.available:
        return None
    while pids & inv.pids():
        if time.monotonic() - t0 > timeout_s:
            return {"released": False, "still_listed": sorted(pids & inv.pids()), "waited_s": timeout_s}
        time.sleep(0.25)
        inv = nvml.inventory()
    return {"released": True, "waited_s": round(time.monotonic() - t0, 3),
            "free_bytes": {g.index: g.memory_free for g in inv.gpus}}
