"""One measured stretch that is a single point of its own (conversations, shared-prefix, trace): the
telemetry sampled through it and the engine's counters read before and after it, into the point, and the
client's self-check over it (`Window.load`). The load points do the same inside `points.run_point`, with the
client's own bookkeeping around it. `calibrate`: characters per token of real text on the server's tokenizer,
which these kinds size their text with."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from servedeck.workloads.target import Target
from servedeck.engines.metrics import Snapshot, metrics_snapshot_async
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import texts
from servedeck.loadgen.prompts import chars_per_token
from servedeck.loadgen.texts import Content
from servedeck.loadgen.loop import current as current_loop
from servedeck.loadgen.records import RequestRecord
from servedeck.runs.figures import counter_delta
from servedeck.runs.folder import RunFolder
from servedeck.telemetry.point import sampled


@dataclass
class Window:
    death: Optional[str] = None  # how the engine ended during the stretch, if it did (read as it closes)
    cpu0: float = field(default_factory=time.process_time)

    def load(self, start: float) -> dict[str, Any]:
        """point["load"] for a stretch that began at perf_counter() `start`: its wall time, and this process's
        CPU time and event loop over it, which the client's self-check (loadgen/stats.py) judges as it judges
        a bench point's (the requests' schedule lag is in their records)."""
        return {"wall_s": time.perf_counter() - start, "client_cpu_s": time.process_time() - self.cpu0,
                "loop": current_loop()}


@asynccontextmanager
async def engine_window(target: Target, folder: RunFolder, point: dict[str, Any]) -> AsyncIterator[Window]:
    """Point 0's stretch: sampled into telemetry.jsonl, the engine's counters before and after (not after when
    the engine died) as point["counters"], the sampler's facts as point["telemetry"]."""
    window = Window()
    async with sampled(folder.path, target, 0) as telemetry:
        before = await metrics_snapshot_async(target.engine, target.base_url)
        window.cpu0 = time.process_time()
        try:
            yield window
        finally:
            window.death = target.death()
            after = await metrics_snapshot_async(target.engine, target.base_url) if window.death is None \
                else Snapshot()
            point["counters"] = counter_delta(before.prefix, after.prefix)
            point["engine_histograms"] = {"before": before.histograms, "after": after.histograms}
            point["telemetry"] = telemetry.facts


async def calibrate(tokens: ServerTokens, content: Content, start: int, size: int) -> float:
    """Characters per token of this content on this server's tokenizer (chat template left out by
    counting two lengths)."""
    cpt = chars_per_token(content)
    bare = await tokens.count_chat([{"role": "user", "content": ""}])
    for _ in range(2):
        text = texts.piece(content, start, int(size * cpt))
        n = await tokens.count_chat([{"role": "user", "content": text}]) - bare
        cpt = len(text) / max(n, 1)
    return cpt


def keep(folder: RunFolder, records: list[RequestRecord], rec: RequestRecord, start: float, t_target: float) -> None:
    """A point-0 record on the run's clock, written to requests.jsonl at once and kept as written (the figures come
    from the record as written, times rounded to the µs, so summary.json and a later `show` agree)."""
    to_run_clock(rec, start, t_target)
    line = rec.to_json()
    folder.request({"point": 0, **line})
    records.append(RequestRecord.from_json(line))


def to_run_clock(rec: RequestRecord, start: float, t_target: float) -> None:
    """A record's times from ApiClient's absolute perf_counter() to the run's clock (0 at `start`), with
    `t_target` the moment it was due."""
    rec.t_target = t_target - start
    for name in ("t_send", "t_first_byte", "t_first_token", "t_end"):
        v = getattr(rec, name)
        if v is not None:
            setattr(rec, name, v - start)
    rec.chunk_t = [x - start for x in rec.chunk_t]
