"""One measured stretch that is a single point of its own (conversations, shared-prefix, trace): the
telemetry sampled through it and the engine's counters read before and after it, into the point. The bench's
points do the same inside `bench.run_point`, with the client's own bookkeeping around it."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

from servedeck.campaign.target import Target
from servedeck.engines.metrics import metrics_snapshot_async
from servedeck.runs.figures import counter_delta
from servedeck.runs.folder import RunFolder
from servedeck.telemetry.point import sampled


@dataclass
class Window:
    death: Optional[str] = None  # how the engine ended during the stretch, if it did (read as it closes)


@asynccontextmanager
async def engine_window(target: Target, folder: RunFolder, point: dict[str, Any]) -> AsyncIterator[Window]:
    """Point 0's stretch: sampled into telemetry.jsonl, the engine's counters before and after (not after when
    the engine died) as point["counters"], the sampler's facts as point["telemetry"]."""
    window = Window()
    async with sampled(folder.path, target, 0) as telemetry:
        before, _ = await metrics_snapshot_async(target.engine, target.base_url)
        try:
            yield window
        finally:
            window.death = target.death()
            after, _ = await metrics_snapshot_async(target.engine, target.base_url) if window.death is None \
                else (None, None)
            point["counters"] = counter_delta(before, after)
            point["telemetry"] = telemetry.facts
