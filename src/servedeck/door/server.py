"""The front door: one address for every model, OpenAI-compatible routing by the body's `model`,
streaming passed through as it arrives, api keys, /metrics and the live page.

`Door` is the handler the clients' connections (door/front.py) hand each request to; it holds one
part per concern and decides nothing itself:
    door/admission.py   keys and the loopback rule, from the request's head
    door/routing.py     a proxied /v1/ call: its model, a replica, the engine, what it leaves behind
    door/management.py  /v1/models, /metrics, the page, its events and /door/status, answered here
    door/relay.py       the engines' side: pooled keep-alive connections, written to the client from
                        the engine socket's own callback
    door/listen.py      the listening sockets: accepting pauses at the descriptor limit, and resumes
    door/checks.py      what a body must be to be forwarded: readable, its numbers within their limits
aiohttp's server in front added ~55 µs of serial work per request (a task, a Request, middleware,
router, a StreamResponse, three writes): at 64 simultaneous requests, 1.7 ms p50 / 8.8 ms p99 of added
TTFT on the H200 host; the raw front removes that (docs/door.md). The door's own routes used to be an
aiohttp app behind a unix socket, reached through the relay; they are answered by the front now.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from servedeck.door.admission import Admission
from servedeck.door.front import Answer, Front, Req, bodies_state
from servedeck.door.management import Management
from servedeck.door.manager import Manager
from servedeck.door.metrics import DoorMetrics
from servedeck.door.relay import Exchange, Relay, UpstreamError
from servedeck.door.routing import Router, is_proxied


class Door:
    """One door: a manager of models, who may ask, where a request goes, and the door's own routes."""

    def __init__(self, manager: Manager, metrics: DoorMetrics, *, api_keys: list[str] = (), host: str = "127.0.0.1",
                 log_bodies: bool = False, body_budget: int | None = None, body_budget_from: str = ""):
        self.manager = manager
        self.body_budget = body_budget  # bytes of request bodies held at once (None: door/front.py's default)
        self.body_budget_from = body_budget_from  # where it was given (the flag or models.toml's key)
        self.metrics = metrics
        self.bind_host = host
        self.relay = Relay()
        self.admission = Admission(api_keys)
        self.router = Router(manager, metrics, self.relay, log_bodies=log_bodies)
        self.management = Management(manager, metrics, self.router.recent, self.admission)

    # --- front.Handler -------------------------------------------------------------------------------
    def admit(self, r: Req) -> Answer | None:
        r.proxied = is_proxied(r)
        a = self.admission.check(r)
        if a is not None and a.status == 401:
            self.metrics.count("-", "401")
        return a

    def handle(self, r: Req) -> None:
        if r.proxied:
            self.router.dispatch(r)
        else:
            self.management.answer(r)

    def ended(self, r: Req, ex: Exchange) -> None:
        self.router.ended(r, ex)

    def failed(self, r: Req, ex: Exchange | None, exc: UpstreamError) -> None:
        self.router.failed(r, ex, exc)

    def gone(self, r: Req) -> None:
        self.router.finish(r, None)


async def run_door(door: Door, host: str, port: int, stop: asyncio.Event, ready: Any = None,
                   preload: list[str] = ()) -> None:
    """Serve until `stop` is set. `ready(port)` is called once listening."""
    front = Front(door, door.body_budget, door.body_budget_from)
    try:
        bound = await front.start(host, port, holders=lambda: {"engine connections": door.relay.open},
                                  say=lambda kind, msg: _say(door, kind, msg))
        door.management.descriptors = front.listener.state  # type: ignore[union-attr]
        door.management.bodies = lambda: bodies_state(front)
        await door.manager.start(preload)
        if ready:
            ready(bound)
        await stop.wait()
    finally:
        await front.close()
        door.relay.close()
        await asyncio.to_thread(door.management.gpu.close)
        await door.manager.close()


def _say(door: Door, kind: str, msg: str) -> None:
    """What the listener says (the descriptor limit reached, then left): on stderr, where whoever runs
    `serve` looks, and as a notice."""
    sys.stderr.write(f"servedeck serve: {msg}\n")
    sys.stderr.flush()
    door.manager.notify(kind, None, msg)
