"""The same GPU samples outside a run: `servedeck gpu --watch` and the doctor's power row read them
through the sampler's own source and conversion (nvml_source.py, sampler.gpu_line), so a watt on the
screen is a watt in telemetry.jsonl. SERVEDECK_TELEMETRY_GPU_REPLAY replays a capture here too."""

from __future__ import annotations

import os
import time
from typing import Any, Iterator, Optional

from servedeck.telemetry.nvml_source import GpuSource, GpuUnavailable, PynvmlSource
from servedeck.telemetry.sampler import gpu_line


def gpu_source() -> GpuSource:
    if os.environ.get("SERVEDECK_TELEMETRY_GPU_REPLAY"):
        from servedeck.telemetry.point import replayed

        return replayed(os.environ["SERVEDECK_TELEMETRY_GPU_REPLAY"])
    return PynvmlSource()


def samples(interval_s: float, count: Optional[int], source: Optional[GpuSource] = None) -> Iterator[dict[str, Any]]:
    """Telemetry lines of every GPU, one round per interval (fixed schedule), `count` rounds or until
    the caller stops; raises GpuUnavailable (with the reason) when no GPU can be read."""
    src = source or gpu_source()
    gpus = src.open(None)
    try:
        start, k = time.perf_counter(), 0
        while count is None or k < count:
            for g in gpus:
                yield {"t": round(time.perf_counter(), 6), "source": "gpu", "kind": "sample", "gpu": g,
                       **gpu_line(src.read(g))}
            for ev in src.xids():
                yield {"t": round(time.perf_counter(), 6), "source": "gpu", "kind": "xid", **ev}
            k += 1
            time.sleep(max(0.0, start + k * interval_s - time.perf_counter()))
    finally:
        src.close()


def readings_now(source: Optional[GpuSource] = None) -> dict[int, dict[str, Any]] | str:
    """One reading per GPU (telemetry lines by GPU index), or the reason none can be taken."""
    try:
        return {ln["gpu"]: ln for ln in samples(0.0, 1, source) if ln["kind"] == "sample"}
    except GpuUnavailable as e:
        return str(e)


def draw_text(lines: dict[int, dict[str, Any]]) -> str:
    """'GPU 0 drawing 124 W (18 % of 700 W)', and any throttle reason, for the doctor's power row."""
    parts = []
    for g, ln in sorted(lines.items()):
        p, lim = ln.get("power_w"), ln.get("limit_w")
        if p is None:
            continue
        share = f" ({p / lim:.0%} of {lim:g} W)" if lim else ""
        why = [r for r in ln.get("throttle") or [] if r != "gpu_idle"]
        parts.append(f"GPU {g} drawing {p:g} W{share}" + (f", clocks held by {', '.join(why)}" if why else ""))
    return "; ".join(parts)
