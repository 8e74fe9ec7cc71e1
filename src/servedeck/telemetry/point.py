"""The hook a measured point (a bench point, a campaign cell's point, a ramp) runs inside:
`async with sampled(folder_path, target, point) as s:` starts the sampler before the point's load
and stops it after; `s.facts` then says what was sampled, and telemetry.jsonl holds the samples."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Optional

from servedeck.engines import get_engine
from servedeck.telemetry.nvml_source import GpuSource, PynvmlSource
from servedeck.telemetry.sampler import FILE, EngineReader, PointSampler, Settings


def launch_gpus(target: Any) -> Optional[list[int]]:
    """The GPUs the launch (all its replicas) was given; None when it names none (every GPU NVML sees)."""
    out: list[int] = []
    for t in getattr(target, "replicas", [target]):
        for g in (t.record.spec or {}).get("gpus") or []:
            if int(g) not in out:
                out.append(int(g))
    return out or None


def sampler_for(folder_path: Path, target: Any, point: Any, settings: Optional[Settings] = None,
                gpu_source: Optional[GpuSource] = None) -> PointSampler:
    settings = settings or Settings.from_env()
    if not settings.enabled:
        off = "SERVEDECK_TELEMETRY=off"
        return PointSampler(folder_path / FILE, point, engine=None, gpu_source=None, gpus=None, settings=settings,
                            not_sampled={"engine": off, "gpu": off})
    names = get_engine(target.engine).telemetry_series()
    urls = [t.base_url for t in getattr(target, "replicas", [target])]
    engine = EngineReader(urls, names, timeout_s=max(2.0, settings.engine_interval_s * 2))
    return PointSampler(folder_path / FILE, point, engine=engine, gpu_source=gpu_source or PynvmlSource(),
                        gpus=launch_gpus(target), settings=settings)


@asynccontextmanager
async def sampled(folder_path: Path, target: Any, point: Any) -> AsyncIterator[PointSampler]:
    """Sample beside the block; opening NVML and the first /metrics read happen off the event loop."""
    sampler = sampler_for(folder_path, target, point)
    await asyncio.to_thread(sampler.start)
    try:
        yield sampler
    finally:
        await asyncio.to_thread(sampler.stop)
