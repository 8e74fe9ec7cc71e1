"""The hook a measured point (a bench point, a campaign cell's point, a workload's stretch) runs inside:
`async with sampled(folder_path, target, point) as s:` starts the sampler before the point's load
and stops it after; `s.facts` then says what was sampled, and telemetry.jsonl holds the samples."""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional

from servedeck.engines import get_engine
from servedeck.errors import UsageError
from servedeck.telemetry.nvml_source import GpuSource, PynvmlSource, RecordedSource
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
    if gpu_source is None and os.environ.get("SERVEDECK_TELEMETRY_GPU_REPLAY"):
        gpu_source = replayed(os.environ["SERVEDECK_TELEMETRY_GPU_REPLAY"])
    names = get_engine(target.engine).telemetry_series()
    urls = [t.base_url for t in getattr(target, "replicas", [target])]
    engine = EngineReader(urls, names, timeout_s=max(2.0, settings.engine_interval_s * 2))
    return PointSampler(folder_path / FILE, point, engine=engine, gpu_source=gpu_source or PynvmlSource(),
                        gpus=launch_gpus(target), settings=settings)


def replayed(path: str) -> GpuSource:
    """SERVEDECK_TELEMETRY_GPU_REPLAY=capture.jsonl: the GPU readings replayed from a capture (scripts/
    gpu-energy.sh writes one) instead of read from NVML: a host without a GPU then runs the whole path,
    figures and report included, on recorded readings. Every line it writes is as a live one's."""
    try:
        return RecordedSource.from_file(Path(path))
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"SERVEDECK_TELEMETRY_GPU_REPLAY={path!r} cannot be replayed: {e}",
                         hint="point it at a capture of NVML readings (JSON lines with gpu, power_mw, energy_mj, "
                              "...), or unset it to read the GPUs") from None


@asynccontextmanager
async def sampled(folder_path: Path, target: Any, point: Any) -> AsyncIterator[PointSampler]:
    """Sample beside the block; opening NVML and the first /metrics read happen off the event loop."""
    sampler = sampler_for(folder_path, target, point)
    await asyncio.to_thread(sampler.start)
    try:
        yield sampler
    finally:
        await asyncio.to_thread(sampler.stop)


@asynccontextmanager
async def sampled_stretch(folder: Any, target: Any, point: str,
                          tally: Callable[[], tuple[int, int]]) -> AsyncIterator[PointSampler]:
    """A stretch that is not a bench point (a ramp's conversation: workloads/ramp.py; a soak), sampled as one: its figures
    over the whole stretch (output tokens and finished requests from `tally()` once it ends) go to
    summary.json's `telemetry` ({"point", "figures", "sampler"})."""
    from servedeck.telemetry.figures import read_lines, span_telemetry

    begin = time.perf_counter()
    async with sampled(folder.path, target, point) as sampler:
        yield sampler
    end = time.perf_counter()
    tokens, requests = tally()
    fig = span_telemetry(read_lines(folder.path).get(point, []), (begin, end), tokens, requests)
    folder.update(telemetry={"point": point, "figures": fig, "sampler": sampler.facts})


def sampled_soak(folder: Any, rec: Any, records: list[dict[str, Any]]) -> Any:
    """A soak (point "soak") on the deck's live record of its engine; `records` its request lines so far."""
    from types import SimpleNamespace

    def tally() -> tuple[int, int]:
        ok = [r for r in records if r.get("status") == "ok"]
        return sum(r.get("output_tokens") or 0 for r in ok), len(ok)

    return sampled_stretch(folder, SimpleNamespace(engine=rec.engine, base_url=rec.base_url, record=rec), "soak",
                           tally)
