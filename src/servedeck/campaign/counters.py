"""The engine's own prefix-cache counters, read from its Prometheus /metrics page.

    vLLM       vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (prompt tokens looked up /
               found in the cache; one series per engine core, summed here)
    llama.cpp  llamacpp:prompt_tokens_total (prompt tokens processed, cache excluded) and
               llamacpp:prompt_tokens_cached_total (reused from the cache): queries = both, hits = cached

Read before and after a measured phase, the change is that phase's cached share, whatever the
requests themselves reported. The counters are server-wide: traffic from anyone else during a
run is counted too (docs/campaign.md says so).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import httpx

from servedeck.engines import get_engine
from servedeck.engines.metrics import parse_prometheus

# llama.cpp's adapter names no prefix-cache counters yet; these are the names its /metrics uses.
_LLAMACPP = {"processed": "llamacpp:prompt_tokens_total", "cached": "llamacpp:prompt_tokens_cached_total"}
def prefix_counters(engine: str, metrics: dict[str, float]) -> Optional[dict[str, float]]:
    """{"queries": tokens looked up, "hits": tokens found} from a parsed page; None if absent."""
    names = get_engine(engine).metrics
    q, h = names.get("prefix_queries"), names.get("prefix_hits")
    if q and h and q in metrics and h in metrics:
        return {"queries": metrics[q], "hits": metrics[h]}
    if engine == "llamacpp" and _LLAMACPP["processed"] in metrics and _LLAMACPP["cached"] in metrics:
        cached = metrics[_LLAMACPP["cached"]]
        return {"queries": metrics[_LLAMACPP["processed"]] + cached, "hits": cached}
    return None


def spec_counters(engine: str, text: str) -> Optional[dict[str, Any]]:
    """The engine's speculative-decoding counters (names from its adapter) from a /metrics page, with
    its generated-token counter beside them; None when the page has none of them."""
    adapter = get_engine(engine)
    metrics = parse_prometheus(text)
    out: dict[str, Any] = {k: metrics[name] for k, name in adapter.spec_metrics.items()
                           if k != "accepted_per_pos" and name in metrics}
    if not out:
        return None
    per_pos_name = adapter.spec_metrics.get("accepted_per_pos")
    if per_pos_name:
        per_pos: dict[str, float] = {}
        for m in re.finditer(rf"^{re.escape(per_pos_name)}\{{([^}}]*)\}}\s+(\S+)", text, re.M):
            pos = re.search(r'position="(\d+)"', m.group(1))
            if pos:
                per_pos[pos.group(1)] = per_pos.get(pos.group(1), 0.0) + float(m.group(2))
        if per_pos:
            out["accepted_per_pos"] = per_pos
    gen = adapter.metrics.get("generation_tokens")
    if gen and gen in metrics:
        out["generation_tokens"] = metrics[gen]
    return out


async def _page(client: httpx.AsyncClient, base_url: str) -> Optional[str]:
    try:
        r = await client.get(base_url.rstrip("/") + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


async def read(client: httpx.AsyncClient, base_url: str, engine: str) -> Optional[dict[str, float]]:
    """The server's prefix-cache counters now; None when /metrics is off or says nothing about them."""
    text = await _page(client, base_url)
    return None if text is None else prefix_counters(engine, parse_prometheus(text))


async def snapshot(client: httpx.AsyncClient, base_url: str,
                   engine: str) -> tuple[Optional[dict[str, float]], Optional[dict[str, Any]]]:
    """(prefix-cache counters, speculation counters) from one read of /metrics."""
    text = await _page(client, base_url)
    if text is None:
        return None, None
    return prefix_counters(engine, parse_prometheus(text)), spec_counters(engine, text)
