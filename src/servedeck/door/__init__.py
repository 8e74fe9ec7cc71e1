"""The front door: one OpenAI-compatible endpoint for the whole deck (docs/door.md).

    policy.py   pure decisions: start, switch, drain, wait, fail; replica choice; ttl
    manager.py  door states, queues, in-flight counts; deck calls off the event loop
    server.py   aiohttp app: routing by body model, streaming pass-through, api keys, /metrics
    page.py     the live page and its server-sent events
    metrics.py  prometheus-client registry (per door) and the NVML collector
"""

from __future__ import annotations

from servedeck.door.serve import ServeOptions, serve

__all__ = ["ServeOptions", "serve"]
