"""The front door: one OpenAI-compatible endpoint for the whole deck (docs/door.md).

    policy.py      pure decisions: start, switch, drain, wait, fail; which replica (ReplicaPolicy); ttl
    manager.py     door states, queues, in-flight counts; deck calls off the event loop
    front.py       the clients' HTTP/1.1 (httptools): parse within the door's limits, then each request
                   handed to a Handler, answered in order
    request.py     one request, and all of its answer's framing: an engine's response piped, a whole
                   answer, a stream
    server.py      Door, that Handler: admission, then routing or the door's own routes; run_door
    admission.py   api keys and the loopback rule
    routing.py     a proxied /v1/ call: its model, a replica, the engine; what it leaves behind
    management.py  /v1/models, /metrics, the page, its events, /door/status
    relay.py       raw HTTP/1.1 to the engines, pooled keep-alive connections
    page.py        the live page and the snapshot it (and /door/status) shows
    metrics.py     prometheus-client registry (per door) and the NVML collector
    serve.py       `servedeck serve`: the door and the watch loop in one process
Imports go one way (tests/door/test_door_imports.py): serve → server → admission, routing, management;
those → front → request (→ relay), manager, page, metrics; manager → metrics → policy.
"""

from __future__ import annotations

from servedeck.door.serve import ServeOptions

# `serve` is reached as servedeck.door.serve.serve: re-exported here it would hide the module serve.py.
__all__ = ["ServeOptions"]
