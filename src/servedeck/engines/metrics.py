"""Reading an engine's Prometheus /metrics page: one reader and one parser for every caller
(watch, campaign, soak). The parser is prometheus-client's; servedeck only sums each sample name
over its label sets (one engine, several model_name / engine-core series)."""

from __future__ import annotations

import asyncio
from typing import Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servedeck.engines import get_engine


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name → value summed over its label sets. A page the parser rejects gives {}."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError):
        return {}
    return out


def read_metrics(base_url: str, timeout_s: float = 5.0) -> Optional[dict[str, float]]:
    """The engine's /metrics page now, parsed; None when it cannot be read."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return parse_prometheus(r.text)


def read_counters(base_url: str, names: dict[str, str], timeout_s: float = 3.0) -> Optional[dict[str, float]]:
    """The engine's counters by servedeck's names (`Engine.metrics`); None when /metrics cannot be read."""
    if not names:
        return None
    raw = read_metrics(base_url, timeout_s)
    if raw is None:
        return None
    return {ours: raw[theirs] for ours, theirs in names.items() if theirs in raw}


def prefix_counters(engine: str, base_url: str) -> Optional[dict[str, float]]:
    """{"queries": prompt tokens looked up, "hits": found in the prefix cache} now, as the engine counts
    them (`Engine.prefix_counters`); None when /metrics is off or says nothing about them. The counters
    are server-wide: anyone else's traffic during a run is counted too."""
    raw = read_metrics(base_url, 10.0)
    return get_engine(engine).prefix_counters(raw) if raw is not None else None


async def prefix_counters_async(engine: str, base_url: str) -> Optional[dict[str, float]]:
    """`prefix_counters` off the event loop (one reader: the blocking one, in a worker thread)."""
    return await asyncio.to_thread(prefix_counters, engine, base_url)
