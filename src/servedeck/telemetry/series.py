"""The engine's state read from one /metrics page: the series its adapter names
(`Engine.telemetry_series`), summed over their label sets.

Only those series' lines reach prometheus-client's parser: vLLM's page is mostly histograms
(~100 KB), and parsing all of it every second would cost the sampler more than the 0.5 % of a
core it is allowed; the lines kept parse to the same values as the whole page."""

from __future__ import annotations

from servedeck.engines.metrics import parse_prometheus


def sample_name(line: str) -> str:
    """A sample line's metric name: what stands before its labels or its value."""
    return line.split("{", 1)[0].split(" ", 1)[0]


def read_series(text: str, names: dict[str, str]) -> tuple[dict[str, float], list[str]]:
    """(servedeck name → value, servedeck names whose series the page lacks) from one /metrics page."""
    wanted = set(names.values())
    prefixes = tuple(wanted)
    kept = [ln for ln in text.splitlines() if ln.startswith(prefixes) and sample_name(ln) in wanted]
    values = parse_prometheus("\n".join(kept) + "\n") if kept else {}
    got = {ours: values[theirs] for ours, theirs in names.items() if theirs in values}
    return got, sorted(k for k in names if k not in got)
