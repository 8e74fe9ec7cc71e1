"""The front door: one OpenAI-compatible endpoint for the whole deck (docs/door.md).

    policy.py   pure decisions: start, switch, drain, wait, fail; replica choice; ttl
    manager.py  door states, queues, in-flight counts; deck calls off the event loop
    front.py    the clients' HTTP/1.1 (httptools): parse, admit, route; answered from the socket callback
    server.py   Door: api keys, routing by the body's model, what a request leaves behind (metrics,
                recent requests); the aiohttp app for /v1/models, /metrics, the page, /door/status
    relay.py    raw HTTP/1.1 to the engines (and to that app), pooled keep-alive connections
    page.py     the live page and its server-sent events
    metrics.py  prometheus-client registry (per door) and the NVML collector
    serve.py    `servedeck serve`: the door and the watch loop in one process
"""

from __future__ import annotations

from servedeck.door.serve import ServeOptions

# `serve` is reached as servedeck.door.serve.serve: re-exported here it would hide the module serve.py.
__all__ = ["ServeOptions"]
