"""The front door: one address for every model, OpenAI-compatible routing by the body's `model`,
streaming passed through as it arrives, api keys, /metrics and the live page.

Three parts, chosen by measurement (`bench/door_latency.py`, docs/door.md):
    door/front.py   the clients' HTTP/1.1 (httptools): a request for a ready model is parsed, routed and
                    written to its engine in the read callback that brought it
    door/relay.py   raw HTTP/1.1 to the engines on pooled keep-alive connections; each read from the
                    engine is parsed and written to the client in one write, from that callback
    this module     `Door`: what a request is routed by (keys, models, metrics, recent requests), and an
                    aiohttp app, reached by the front over a private unix socket, for what is not a
                    proxied /v1/ call: /v1/models, /metrics, the page, its events and /door/status
aiohttp's server in front added ~55 µs of serial work per request (a task, a Request, middleware,
router, a StreamResponse, three writes): at 64 simultaneous requests, 1.7 ms p50 / 8.8 ms p99 of added
TTFT on the H200 host; the raw front removes that from the path that carries the traffic.

Routes
    GET  /v1/models                 every model and alias, with its door state
    *    /v1/{path}                 proxied to the model named by the JSON body's "model"
    GET  /metrics                   Prometheus text (management)
    GET  /  and  /events            the live page and its server-sent events (management)
    GET  /door/status               the same snapshot as JSON (management)
Management endpoints need the api key when one is set; with none set they answer only loopback
peers, so a non-loopback bind never opens them without a key.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections import deque
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web

from servedeck.door import policy as Pol
from servedeck.door.front import HOP, Answer, Front, Req, answer_refusal, error_body
from servedeck.door.manager import Manager, Refusal
from servedeck.door.metrics import DoorMetrics
from servedeck.door.relay import Exchange, Relay, UpstreamError

log = logging.getLogger("servedeck.door")

USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
WAITED_HEADER = "x-servedeck-waited"  # `28.2s min-residency, 2.0s switch`: how long and why a request waited
DOOR_KEY: web.AppKey["Door"] = web.AppKey("door")


class Door:
    """One door: a manager of models, the proxy's decisions, and what the page shows."""

    def __init__(self, manager: Manager, metrics: DoorMetrics, *, api_keys: list[str] = (), host: str = "127.0.0.1",
                 log_bodies: bool = False):
        self.manager = manager
        self.metrics = metrics
        self.keys = [k.encode() for k in api_keys if k]
        self.bind_host = host
        self.log_bodies = log_bodies
        self.recent: deque[dict] = deque(maxlen=50)
        self.relay = Relay()
        self.internal_url = ""  # "unix:PATH": the aiohttp app below, set by run_door
        self.page_extra = None  # set by the app: notices and log tails for the page

    # --- the management app (reached through the front) ----------------------------------------------
    def app(self) -> web.Application:
        from servedeck.door import page

        app = web.Application(client_max_size=256 * 1024**2)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/door/status", self.status)
        app.router.add_get("/", page.index)
        app.router.add_get("/events", page.events)
        app[DOOR_KEY] = self
        return app

    # --- security ------------------------------------------------------------------------------------
    def _key_ok(self, given: bytes | None) -> bool:
        if not given:
            return False
        ok = False
        for k in self.keys:  # every key compared, in constant time: no early exit to time
            ok |= hmac.compare_digest(given, k)
        return ok

    def admit(self, r: Req, loopback: bool) -> Answer | None:
        """From the request's head: None when it may go on, else the answer it gets instead."""
        mgmt = not r.path.startswith(b"/v1/")
        if self.keys:
            auth = r.header(b"authorization") or b""
            given = auth[7:].strip() if auth[:7].lower() == b"bearer " else r.header(b"x-api-key")
            if given is None and mgmt and b"?" in r.url:  # the page's EventSource cannot send headers
                q = parse_qs(r.url.split(b"?", 1)[1].decode("latin-1")).get("key")
                given = q[0].encode("latin-1") if q else None
            if not self._key_ok(given):
                self.count("-", 401)
                return Answer(401, error_body(401, "missing or wrong api key",
                                              "send Authorization: Bearer <key> (the key given to "
                                              "--api-key, SERVEDECK_API_KEY or [host] api_keys)"),
                              {"WWW-Authenticate": "Bearer"})
        elif mgmt and not loopback:
            path = r.path.decode("latin-1")
            return Answer(403, error_body(403, f"{path} is a management endpoint and no api key is set: "
                                               "it answers only on loopback",
                                          "set --api-key / SERVEDECK_API_KEY to open it to other hosts"))
        return None

    def count(self, model: str, status: int | str) -> None:
        self.metrics.count(model, str(status))

    # --- routing -------------------------------------------------------------------------------------
    def payload(self, r: Req, body: bytes, url: str) -> bytes:
        """The request as the upstream gets it: target and headers as the client sent them (hop-by-hop
        ones and the door's own key dropped), Host the upstream's, the body's length."""
        host = self.relay.host_for(url)
        method = b"GET" if r.method == b"HEAD" else r.method  # httptools cannot read a bodiless HEAD answer:
        parts = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, r.url, host)]  # GET, body dropped (front)
        parts += [k + b": " + v + b"\r\n" for k, v in r.headers if k.lower() not in HOP]
        if body or r.method in (b"POST", b"PUT", b"PATCH"):
            parts.append(b"Content-Length: %d\r\n" % len(body))
        parts.append(b"\r\n")
        parts.append(body)
        return b"".join(parts)

    def dispatch(self, r: Req) -> None:
        """Send `r` on its way: to its model's engine, or to the management app. Raises Answer for
        what the door answers itself."""
        if not r.proxied:
            self._start(r, self.internal_url, self.payload(r, b"".join(r.body), self.internal_url))
            return
        body = b"".join(r.body)
        if self.log_bodies:
            log.info("request %s %s body=%s", r.method.decode(), r.url.decode("latin-1"),
                     body[:4096].decode(errors="replace"))
        name = doc = None
        if body:
            try:
                doc = json.loads(body)
                name = doc.get("model") if isinstance(doc, dict) else None
            except ValueError:
                pass
        if not isinstance(name, str) or not name:
            self.count("-", 400)
            raise Answer(400, error_body(400, f"{r.path.decode('latin-1')}: the JSON body names no \"model\"",
                                         "send {\"model\": NAME, ...}; GET /v1/models lists the names"))
        mgr = self.manager
        try:
            model = mgr.resolve(name)
        except Refusal as e:
            self.count("-", 404)
            raise answer_refusal(e) from None
        r.model = model
        r.entry = {"model": model, "path": r.path.decode("latin-1"), "status": None, "ttft_ms": None,
                   "e2e_ms": None, "tokens": None, "waited": None, "at": time.time()}
        self.recent.append(r.entry)
        rep = mgr.take_ready(model)
        if rep is None:  # not ready: wait for it (a boot or a switch) in a task
            r.task = asyncio.get_running_loop().create_task(self._wait_then_send(r, model, name, doc, body))
            return
        self._send(r, rep, model, name, doc, body)

    async def _wait_then_send(self, r: Req, model: str, name: str, doc: Any, body: bytes) -> None:
        waited = Pol.Waited(since=self.manager.clock())
        try:
            rep = await self.manager.acquire(model, waited)
        except Refusal as e:
            r.task = None
            r.model = None  # answered here, not by finish()
            a = answer_refusal(e)
            why = waited.text()
            if why:
                a.headers[WAITED_HEADER] = why
            if r.entry is not None:
                r.entry.update(status=e.status, e2e_ms=round((time.perf_counter() - r.t0) * 1e3, 1), error=e.message,
                               waited=why or None)
            self.count(model, e.status)
            r.conn.respond(r, a)
            return
        r.task = None
        why = waited.text()
        if why:  # said in the response's head and on the page: why this request did not start at once
            r.waited = b"%s: %s\r\n" % (WAITED_HEADER.encode(), why.encode())
            if r.entry is not None:
                r.entry["waited"] = why
        if r.conn.closed:  # the client left as the model became ready
            self.manager.release(model, rep)
            return
        self._send(r, rep, model, name, doc, body)

    def _send(self, r: Req, rep: Any, model: str, name: str, doc: Any, body: bytes) -> None:
        r.rep = rep
        rt = self.manager.models[model]
        if doc is not None and name != rt.served_name and rt.managed:
            doc["model"] = rt.served_name  # an alias: the engine knows the model by its served name
            body = json.dumps(doc).encode()
        self._start(r, rep.url, self.payload(r, body, rep.url))

    def _start(self, r: Req, url: str, payload: bytes) -> None:
        got = self.relay.start(url, payload, r)
        if isinstance(got, Exchange):
            r.ex = got
        else:
            r.task = got

    def finish(self, r: Req, ex: Exchange | None) -> None:
        """A proxied request is over (answered, failed or abandoned): give its replica back, count it,
        and fill in its line on the page. Once per request; nothing for management requests."""
        model = r.model
        if model is None:
            return
        r.model = None
        if r.rep is not None:
            self.manager.release(model, r.rep)
            r.rep = None
        e2e = time.perf_counter() - r.t0
        mm = self.metrics.of(model)
        mm.e2e.observe(e2e)
        self.count(model, r.status)
        entry = r.entry
        if ex is not None:
            if ex.t_first_body is not None:
                ttft = ex.t_first_body - r.t0
                mm.ttft.observe(ttft)
                if entry is not None:
                    entry["ttft_ms"] = round(ttft * 1e3, 1)
            m = USAGE_RE.findall(ex.usage_body[-4096:])
            if entry is not None:
                entry["tokens"] = int(m[-1]) if m else None
        if entry is not None:
            entry["status"] = r.status
            entry["e2e_ms"] = round(e2e * 1e3, 1)

    def upstream_failed(self, r: Req, exc: UpstreamError) -> None:
        """The upstream failed before answering: 502, naming it."""
        r.status = 502
        if r.proxied:
            url = r.rep.url if r.rep is not None else "?"
            model = r.model
            self.metrics.upstream_failures.labels(model or "-", "before-response").inc()
            self.finish(r, None)
            a = Answer(502, error_body(502, f"{model} at {url}: {exc}", f"`servedeck logs {model}` shows the engine's side"))
        else:
            a = Answer(502, error_body(502, f"the door's own app did not answer: {exc}"))
        r.conn.respond(r, a)

    def stream_broke(self, r: Req, ex: Exchange | None, exc: UpstreamError) -> None:
        """The engine broke off a response after its head went out: the request is counted now (502,
        an upstream failure mid-stream) and its replica given back. An event stream ends once the
        cause is known (the engine's own ending, read in a thread) with an error event naming it; any
        other body cannot say more, so the client's connection is cut (an incomplete body, not a clean end)."""
        model = r.model or "-"
        url = r.rep.url if r.rep is not None else "?"
        r.status = 502
        self.metrics.upstream_failures.labels(model, "mid-stream").inc()
        self.finish(r, ex)
        if ex is not None and r.can_end_with_an_event(ex):
            r.task = asyncio.get_running_loop().create_task(self._end_broken_stream(r, model, url, exc))
        else:
            r.conn.close()

    async def _end_broken_stream(self, r: Req, model: str, url: str, exc: UpstreamError) -> None:
        try:
            message, cause = await asyncio.to_thread(self.manager.why_stream_broke, model, url, str(exc))
        except Exception as e:  # the stream must still end properly
            message, cause = f"{model} at {url} broke off the response: {exc} (and reading why failed: {e})", None
        r.task = None
        if r.entry is not None:
            r.entry["error"] = message
        r.end_stream(error_body(502, message, f"`servedeck logs {model}` shows the engine's side", cause=cause))

    # --- management ----------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        data = []
        for m in self.manager.snapshot():
            for n in [m["model"], *m["aliases"]]:
                data.append({"id": n, "object": "model", "owned_by": "servedeck", "created": 0,
                             "servedeck": {"model": m["model"], "alias_of": m["model"] if n != m["model"] else None,
                                           "state": m["state"], "slot": m["slot"], "detail": m["detail"]}})
        return web.json_response({"object": "list", "data": data})

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
    sockdir = tempfile.mkdtemp(prefix="servedeck-door-")  # 0700: the app behind it checks no keys
    front = Front(door)
    try:
        path = os.path.join(sockdir, "app.sock")
        await web.UnixSite(runner, path).start()
        door.internal_url = "unix:" + path
        bound = await front.start(host, port)
        await door.manager.start(preload)
        if ready:
            ready(bound)
        await stop.wait()
    finally:
        await front.close()
        door.relay.close()
        await door.manager.close()
        await runner.cleanup()
        shutil.rmtree(sockdir, ignore_errors=True)
