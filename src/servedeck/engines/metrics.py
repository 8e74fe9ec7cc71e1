"""Reading an engine's Prometheus /metrics page: one parser for every caller (watch, campaign, soak)."""

from __future__ import annotations

import re

import httpx

# Prometheus text format, one sample a line: name{labels} value. Hand-parsed: prometheus_client's
# parser is a dependency for ~10 lines, and we only need the sum of each metric's series.
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaINFA]+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name → value summed over its label sets (one engine, several model_name/engine labels)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


def read_counters(base_url: str, names: dict[str, str], timeout_s: float = 3.0) -> dict[str, float] | None:
    """The engine's counters by servedeck's names (`Engine.metrics`); None when /metrics cannot be read."""
    if not names:
        return None
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
        if r.status_code != 200:
            return None
    except httpx.HTTPError:
        return None
    raw = parse_prometheus(r.text)
    return {ours: raw[theirs] for ours, theirs in names.items() if theirs in raw}
