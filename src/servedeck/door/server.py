"""The front door's HTTP side: OpenAI-compatible routing by the body's `model`, streaming passed
through as it arrives, api keys, /metrics and the live page.

Stack: aiohttp's server, and raw HTTP/1.1 upstream (door/relay.py: httptools parses the engine's
response, each chunk is written to the client's socket from the engine socket's callback). Both chosen
by measurement (`bench/door_latency.py`, docs/door.md): aiohttp's server added 1.8 ms at 1 stream and
37 ms p50 at 64 (a busy 2-core box) where a bare Starlette/uvicorn/httpx proxy added 5.9 and 606 ms;
aiohttp's client upstream then cost a request build per request and a coroutine wake-up per chunk.
aiohttp's handler cancellation turns a client's disconnect into closing the engine connection, which is
how the engines learn to stop generating.

Routes
    GET  /v1/models                 every model and alias, with its door state
    POST /v1/{path}                 proxied to the model named by the JSON body's "model"
    GET  /metrics                   Prometheus text (management)
    GET  /  and  /events            the live page and its server-sent events (management)
    GET  /door/status               the same snapshot as JSON (management)
Management endpoints need the api key when one is set; with none set they answer only loopback
peers, so a non-loopback bind never opens them without a key.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import re
import time
from collections import deque
from typing import Any

from aiohttp import web

from servedeck.door.manager import Manager, Refusal
from servedeck.door.metrics import DoorMetrics
from servedeck.door.relay import Exchange, Relay, UpstreamError

log = logging.getLogger("servedeck.door")

HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
       "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key",
       "expect"}  # the door answered the client's Expect: 100-continue itself when it read the body
# Response headers the door sets itself (aiohttp writes its own Server/Date; length/chunking follow the stream).
RESP_DROP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}
USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
DOOR_KEY: web.AppKey["Door"] = web.AppKey("door")


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def error_body(status: int, message: str, hint: str | None = None, **extra: Any) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 429: "rate_limit_error"}.get(status, "server_error")
    err = {"message": message, "type": kind, "code": status}
    if hint:
        err["hint"] = hint
    err.update({k: v for k, v in extra.items() if v is not None})
    return {"error": err}


def refusal_response(r: Refusal) -> web.Response:
    headers = {"Retry-After": str(int(max(1, round(r.retry_after_s))))} if r.retry_after_s else {}
    return web.json_response(error_body(r.status, r.message, r.hint, cause=r.cause), status=r.status,
                             headers=headers)


class Door:
    """One door: a manager of models, the proxy, and what the page shows."""

    def __init__(self, manager: Manager, metrics: DoorMetrics, *, api_keys: list[str] = (), host: str = "127.0.0.1",
                 log_bodies: bool = False):
        self.manager = manager
        self.metrics = metrics
        self.keys = [k.encode() for k in api_keys if k]
        self.bind_host = host
        self.log_bodies = log_bodies
        self.recent: deque[dict] = deque(maxlen=50)
        self.relay = Relay()
        self.page_extra = None  # set by the app: notices and log tails for the page

    # --- the app -------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        from servedeck.door import page

        app = web.Application(middlewares=[self._auth], client_max_size=256 * 1024**2)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/v1/{tail:.*}", self.proxy)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/door/status", self.status)
        app.router.add_get("/", page.index)
        app.router.add_get("/events", page.events)
        app[DOOR_KEY] = self
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        self.relay.close()

    # --- security ------------------------------------------------------------------------------------
    def _key_ok(self, given: str | None) -> bool:
        if not given:
            return False
        g = given.encode()
        ok = False
        for k in self.keys:  # every key compared, in constant time: no early exit to time
            ok |= hmac.compare_digest(g, k)
        return ok

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        mgmt = not request.path.startswith("/v1/")
        if self.keys:
            auth = request.headers.get("Authorization", "")
            given = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
            if given is None and mgmt:
                given = request.query.get("key")  # the page's EventSource cannot send headers
            if not self._key_ok(given):
                self.metrics.requests.labels("-", "401").inc()
                return web.json_response(error_body(401, "missing or wrong api key",
                                                    "send Authorization: Bearer <key> (the key given to "
                                                    "--api-key, SERVEDECK_API_KEY or [host] api_keys)"),
                                         status=401, headers={"WWW-Authenticate": "Bearer"})
        elif mgmt and not is_loopback(request.remote):
            return web.json_response(error_body(403, f"{request.path} is a management endpoint and no api key is set: "
                                                     "it answers only on loopback",
                                                "set --api-key / SERVEDECK_API_KEY to open it to other hosts"),
                                     status=403)
        return await handler(request)

    # --- OpenAI routes -------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        data = []
        for m in self.manager.snapshot():
            for n in [m["model"], *m["aliases"]]:
                data.append({"id": n, "object": "model", "owned_by": "servedeck", "created": 0,
                             "servedeck": {"model": m["model"], "alias_of": m["model"] if n != m["model"] else None,
                                           "state": m["state"], "slot": m["slot"], "detail": m["detail"]}})
        return web.json_response({"object": "list", "data": data})

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        body = await request.read()
        if self.log_bodies:
            log.info("request %s %s body=%s", request.method, request.path, body[:4096].decode(errors="replace"))
        name = None
        doc = None
        if body:
            try:
                doc = json.loads(body)
                name = doc.get("model") if isinstance(doc, dict) else None
            except ValueError:
                pass
        if not isinstance(name, str) or not name:
            self.metrics.requests.labels("-", "400").inc()
            return web.json_response(error_body(400, f"{request.path}: the JSON body names no \"model\"",
                                                "send {\"model\": NAME, ...}; GET /v1/models lists the names"),
                                     status=400)
        mgr = self.manager
        try:
            model = mgr.resolve(name)
        except Refusal as r:
            self.metrics.requests.labels("-", "404").inc()
            return refusal_response(r)
        entry = {"model": model, "path": request.path, "status": None, "ttft_ms": None, "e2e_ms": None,
                 "tokens": None, "at": time.time()}
        self.recent.append(entry)
        try:
            rep = await mgr.acquire(model)
        except Refusal as r:
            entry.update(status=r.status, e2e_ms=round((time.perf_counter() - t0) * 1e3, 1), error=r.message)
            self.metrics.requests.labels(model, str(r.status)).inc()
            return refusal_response(r)
        rt = mgr.models[model]
        mm = self.metrics.of(model)
        if doc is not None and name != rt.served_name and rt.managed:
            doc["model"] = rt.served_name  # an alias: the engine knows the model by its served name
            body = json.dumps(doc).encode()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        status = "000"
        resp: web.StreamResponse | None = None
        ex: Exchange | None = None
        try:
            ex = await self.relay.send(rep.url, request.method, request.raw_path, headers, body)
            status = str(ex.status)
            resp = web.StreamResponse(status=ex.status, reason=ex.reason or None)
            for k, v in ex.headers:
                if k.lower() not in RESP_DROP:
                    resp.headers.add(k, v)
            if ex.length is not None:
                resp.content_length = ex.length
            else:
                resp.enable_chunked_encoding()
            await resp.prepare(request)
            if request.transport is None:
                raise ConnectionResetError("the client went away")
            ex.pipe(request.transport, chunked=ex.length is None)  # as it arrives: chunk by chunk, no buffering
            await ex.done
            await resp.write_eof()
            if ex.t_first_body is not None:
                ttft = ex.t_first_body - t0
                mm.ttft.observe(ttft)
                entry["ttft_ms"] = round(ttft * 1e3, 1)
            m = USAGE_RE.findall(ex.usage_body[-4096:])
            entry["tokens"] = int(m[-1]) if m else None
        except asyncio.CancelledError:
            status = "499"  # the client went away; closing the engine connection (below) stops its work
            raise
        except ConnectionResetError:
            status = "499"  # the client went away while we wrote
            raise
        except UpstreamError as e:
            status = "502"
            if resp is None or not resp.prepared:
                return web.json_response(error_body(502, f"{model} at {rep.url}: {e}",
                                                    f"`servedeck logs {model}` shows the engine's side"),
                                         status=502)
            # The engine's stream broke after the headers went out: cut the client's connection too, so
            # it sees an incomplete response instead of a clean end.
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError(f"{model}: upstream stream ended early: {e}") from None
        finally:
            if ex is not None:
                if status in ("499", "502") or not ex.complete:
                    ex.abort()
                self.relay.release(ex)
            mgr.release(model, rep)
            e2e = time.perf_counter() - t0
            mm.e2e.observe(e2e)
            self.metrics.requests.labels(model, status).inc()
            entry.update(status=int(status), e2e_ms=round(e2e * 1e3, 1))
        return resp

    # --- management ----------------------------------------------------------------------------------
    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        body = await asyncio.to_thread(self.metrics.render)  # NVML reads may take a moment
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def status(self, request: web.Request) -> web.Response:
        from servedeck.door.page import snapshot

        return web.json_response(await snapshot(self), dumps=lambda o: json.dumps(o, default=str))


async def run_door(door: Door, host: str, port: int, stop: asyncio.Event, ready: Any = None,
                   preload: list[str] = ()) -> None:
    """Serve until `stop` is set. `ready(port)` is called once listening."""
    runner = web.AppRunner(door.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    try:
        await site.start()
        bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port
        await door.manager.start(preload)
        if ready:
            ready(bound)
        await stop.wait()
    finally:
        await door.manager.close()
        await runner.cleanup()
