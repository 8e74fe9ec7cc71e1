"""Reading an engine's Prometheus /metrics page: one reader and one parser for every caller
(watch, campaign, soak). The parser is prometheus-client's; servedeck only sums each sample name
over its label sets (one engine, several model_name / engine-core series)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Optional

import httpx

from servedeck.engines import get_engine


def _families(text: str) -> Any:
    """prometheus-client's parser, imported on first use: every servedeck command imports this module."""
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families(text)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name → value summed over its label sets. A page the parser rejects gives {}."""
    out: dict[str, float] = {}
    try:
        for family in _families(text):
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


def spec_counters(engine: str, text: str) -> Optional[dict[str, Any]]:
    """The engine's speculative-decoding counters (names from its adapter's `spec_metrics`) from a
    /metrics page, per-position ones by their `position` label, with its generated-token counter
    beside them; None when the page has none of them."""
    adapter = get_engine(engine)
    if not adapter.spec_metrics:
        return None
    metrics = parse_prometheus(text)
    out: dict[str, Any] = {k: metrics[name] for k, name in adapter.spec_metrics.items()
                           if k != "accepted_per_pos" and name in metrics}
    if not out:
        return None
    per_pos_name = adapter.spec_metrics.get("accepted_per_pos")
    if per_pos_name:
        per_pos: dict[str, float] = {}
        try:
            for family in _families(text):
                for sample in family.samples:
                    pos = sample.labels.get("position")
                    if sample.name == per_pos_name and pos is not None:
                        per_pos[pos] = per_pos.get(pos, 0.0) + float(sample.value)
        except (ValueError, TypeError, IndexError):
            per_pos = {}
        if per_pos:
            out["accepted_per_pos"] = per_pos
    gen = adapter.metrics.get("generation_tokens")
    if gen and gen in metrics:
        out["generation_tokens"] = metrics[gen]
    return out


def read_histograms(text: str, names: dict[str, tuple[str, ...]]) -> Optional[dict[str, Any]]:
    """The engine's own latency histograms from a /metrics page, by servedeck's names (`Engine.
    latency_histograms`: the first of each key's Prometheus names that the page carries): per key
    {"name", "buckets": [[upper bound, cumulative count], ...] ending at +Inf, "sum", "count"}, summed over
    label sets (model_name, engine core). None when the page has none of them."""
    if not names:
        return None
    found: dict[str, dict[str, Any]] = {}
    try:
        for family in _families(text):
            if family.type != "histogram":
                continue
            h: dict[str, Any] = {"buckets": {}, "sum": 0.0, "count": 0.0}
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    h["buckets"][le] = h["buckets"].get(le, 0.0) + float(sample.value)
                elif sample.name.endswith("_sum"):
                    h["sum"] += float(sample.value)
                elif sample.name.endswith("_count"):
                    h["count"] += float(sample.value)
            found[family.name] = h
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    out: dict[str, Any] = {}
    for key, candidates in names.items():
        for name in candidates:
            if name in found:
                h = found[name]
                out[key] = {"name": name, "buckets": sorted([le, c] for le, c in h["buckets"].items()),
                            "sum": h["sum"], "count": h["count"]}
                break
    return out or None


@dataclass(frozen=True)
class Snapshot:
    """One read of the engine's /metrics before or after a measured stretch: prefix-cache counters,
    speculation counters, latency histograms (each None when the page has none, all None when unreadable)."""

    prefix: Optional[dict[str, float]] = None
    spec: Optional[dict[str, Any]] = None
    histograms: Optional[dict[str, Any]] = None


def metrics_snapshot(engine: str, base_url: str) -> Snapshot:
    """The engine's counters and histograms from one read of /metrics; an empty Snapshot if unreadable."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return Snapshot()
    if r.status_code != 200:
        return Snapshot()
    adapter = get_engine(engine)
    return Snapshot(adapter.prefix_counters(parse_prometheus(r.text)), spec_counters(engine, r.text),
                    read_histograms(r.text, adapter.latency_histograms))


async def metrics_snapshot_async(engine: str, base_url: str) -> Snapshot:
    return await asyncio.to_thread(metrics_snapshot, engine, base_url)


async def prefix_counters_async(engine: str, base_url: str) -> Optional[dict[str, float]]:
    """`prefix_counters` off the event loop (one reader: the blocking one, in a worker thread)."""
    return await asyncio.to_thread(prefix_counters, engine, base_url)
