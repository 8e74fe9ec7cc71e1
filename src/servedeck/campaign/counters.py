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

from typing import Optional

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


async def read(client: httpx.AsyncClient, base_url: str, engine: str) -> Optional[dict[str, float]]:
    """The server's prefix-cache counters now; None when /metrics is off or says nothing about them."""
    try:
        r = await client.get(base_url.rstrip("/") + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return prefix_counters(engine, parse_prometheus(r.text))
