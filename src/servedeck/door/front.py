"""The door's client side: HTTP/1.1 from clients, parsed by httptools, each request answered from the
socket's own callbacks.

Why not aiohttp's server for this (what the door used first): every request paid for a handler task,
a `Request`, the middleware and router, a `StreamResponse` and separate writes for the head, the
body and the end. On one event loop that is paid one request after another: a closed loop's 64
simultaneous requests waited ~55 µs each behind each other on the H200 host (docs/door.md). Here a
request for a ready model is parsed, routed, and written to the engine in the read callback that
brought it; the engine's head goes out with the first body piece in one write. A task is made only
when a request must wait (for a boot, a switch, or a new engine connection).

Routes:
    /v1/*  (but GET /v1/models)     proxied to the model named by the JSON body's "model"
    everything else                 relayed, over a unix socket, to the door's aiohttp app
                                    (door/server.py: /v1/models, /metrics, /, /events, /door/status)
Api keys and the loopback rule for management endpoints are checked here, for every route.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import httptools

from servedeck.door.manager import Refusal
from servedeck.door.relay import END_CHUNK, Exchange, UpstreamError
from servedeck.errors import DoorError

if TYPE_CHECKING:
    from servedeck.door.server import Door

log = logging.getLogger("servedeck.door")

MAX_HEAD = 64 * 1024  # request line and headers
MAX_BODY = 256 * 1024**2
MAX_QUEUED = 8  # pipelined requests read ahead on one connection before reading pauses
KEEPALIVE_S = 75.0  # an idle client connection is closed after this long (aiohttp's default)
WRITE_HIGH, WRITE_LOW = 1 << 20, 1 << 18  # a slow client pauses its engine's socket above, resumes below
HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
       b"transfer-encoding", b"upgrade", b"host", b"content-length", b"authorization", b"x-api-key",
       b"expect", b"proxy-connection"}  # the door answers a client's Expect: 100-continue itself
RESP_DROP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length"}
REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
           413: b"Payload Too Large", 429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
           499: b"Client Closed Request", 502: b"Bad Gateway", 503: b"Service Unavailable",
           504: b"Gateway Timeout"}


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
            404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
            431: "invalid_request_error"}.get(status, "server_error")
    err = {"message": message, "type": kind, "code": status}
    if hint:
        err["hint"] = hint
    err.update({k: v for k, v in extra.items() if v is not None})
    return {"error": err}


class Answer(DoorError):
    """A response the door makes itself (an error), raised where it is decided."""

    def __init__(self, status: int, body: dict, headers: dict[str, str] | None = None, close: bool = False):
        self.status, self.body, self.headers, self.close = status, body, headers or {}, close


class Req:
    """One client request: what was parsed, and how its answer is going. The relay's listener."""

    __slots__ = ("conn", "t0", "method", "url", "headers", "body", "size", "keep_alive", "http11", "expect",
                 "proxied", "answer", "model", "rep", "ex", "task", "entry", "status", "head_sent",
                 "chunked", "finished", "waited")

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.t0 = time.perf_counter()
        self.method = b""
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.size = 0
        self.keep_alive = True
        self.http11 = True
        self.expect = False
        self.proxied = False
        self.answer: Answer | None = None  # decided from the head (401, 403, 413): answered instead
        self.model: str | None = None
        self.rep = None  # the replica taken from the manager, given back exactly once
        self.ex: Exchange | None = None
        self.task: asyncio.Task | None = None
        self.entry: dict | None = None
        self.status = 0
        self.head_sent = False
        self.chunked = False
        self.finished = False
        self.waited = b""  # the x-servedeck-waited header line, for a request that waited for its model

    @property
    def path(self) -> bytes:
        return self.url.split(b"?", 1)[0]

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    # --- the relay's listener ------------------------------------------------------------------------
    def on_head(self, ex: Exchange) -> None:
        if self.finished:
            return
        conn = self.conn
        self.status = ex.status
        lines = [b"HTTP/1.1 %d %s\r\n" % (ex.status, ex.reason or REASONS.get(ex.status, b""))]
        lines += [b"%s: %s\r\n" % (k, v) for k, v in ex.headers if k.lower() not in RESP_DROP]
        no_body = self.method == b"HEAD" or ex.status in (204, 304)
        if ex.length is not None:
            lines.append(b"Content-Length: %d\r\n" % ex.length)
        elif no_body:
            pass
        elif self.http11:
            self.chunked = True
            lines.append(b"Transfer-Encoding: chunked\r\n")
        else:
            self.keep_alive = False  # an HTTP/1.0 client: the body ends when the door closes
        if not self.keep_alive:
            lines.append(b"Connection: close\r\n")
        elif not self.http11:
            lines.append(b"Connection: keep-alive\r\n")
        if self.waited:
            lines.append(self.waited)
        lines.append(b"\r\n")
        self.head_sent = True
        # the head leaves with the first body piece
        ex.pipe(conn.transport, self.chunked, b"".join(lines), body=self.method != b"HEAD")

    def on_end(self, ex: Exchange) -> None:
        if self.finished:
            return
        self.conn.door.finish(self, ex)
        self.conn.relay.release(ex)
        self.ex = None
        self.conn.finished(self)

    def on_fail(self, ex: Exchange | None, exc: UpstreamError) -> None:
        if self.finished:
            return
        self.ex = None
        if not self.head_sent:
            self.conn.door.upstream_failed(self, exc)  # answers 502
            return
        if self.proxied:
            self.conn.door.stream_broke(self, ex, exc)  # an event stream ends with an error event
            return
        # The management app's answer broke after its head went out: cut the client's connection too,
        # so it sees an incomplete response instead of a clean end.
        self.status = 502
        self.conn.close()

    def can_end_with_an_event(self, ex: Exchange) -> bool:
        """An event stream whose body the door frames (chunked, or ended by close): one more event
        can still be said before its end. Asked only when a response broke, never per chunk."""
        if self.method == b"HEAD" or ex.length is not None or not (self.chunked or not self.keep_alive):
            return False
        return any(k.lower() == b"content-type" and v.lower().startswith(b"text/event-stream")
                   for k, v in ex.headers)

    def end_stream(self, error: dict) -> None:
        """End an event stream its engine broke off as OpenAI-compatible servers end a stream that
        failed: `data: {"error": ...}`, then `data: [DONE]`, then the body's proper end (the last
        chunk, or the close for an HTTP/1.0 client). The connection then goes on as after any answer."""
        if self.finished:
            return
        conn = self.conn
        # A blank line first: it ends an event the cut left half-written (which then fails to parse on
        # its own instead of swallowing the error event); SSE parsers skip a blank line otherwise.
        events = b"\n\ndata: %b\n\ndata: [DONE]\n\n" % json.dumps(error).encode()
        if conn.transport is not None and not conn.closed:
            conn.transport.write(b"%x\r\n%b\r\n%b" % (len(events), events, END_CHUNK) if self.chunked else events)
        conn.finished(self)

    def retrying(self, task: asyncio.Task) -> None:
        self.task = task
        self.ex = None


class Conn(asyncio.Protocol):
    """One client connection: requests parsed as they come, answered one after another."""

    def __init__(self, door: Door, front: Front) -> None:
        self.door = door
        self.front = front
        self.relay = door.relay
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.loopback = False
        self.cur: Req | None = None  # being parsed
        self.queue: deque[Req] = deque()  # parsed, waiting for the one before to be answered
        self.active: Req | None = None
        self.closed = False
        self.reading_paused = False
        self.head_bytes = 0
        self.last = time.monotonic()
        self._in_next = False

    # --- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        self.loopback = is_loopback(peer[0] if isinstance(peer, tuple) else None)
        self.front.conns.add(self)

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse_now(Answer(400, error_body(400, "the door does not upgrade connections"),
                                    close=True))
        except httptools.HttpParserError as e:
            cause = e.__context__
            if isinstance(cause, Answer):
                self._refuse_now(cause)
            else:
                self._refuse_now(Answer(400, error_body(400, f"not a valid HTTP/1.1 request: {e}"),
                                        close=True))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.conns.discard(self)
        r = self.active
        self.active = None
        self.queue.clear()
        if r is not None and not r.finished:
            if r.task is not None:
                r.task.cancel()  # waiting for a model or connecting: the wait ends, queued counts drop
            if r.ex is not None:
                r.ex.abort()  # the engine sees its connection close and stops generating
                r.ex = None
            r.status = 499
            self.door.finish(r, None)

    def pause_writing(self) -> None:
        r = self.active
        if r is not None and r.ex is not None:
            r.ex.pause()

    def resume_writing(self) -> None:
        r = self.active
        if r is not None and r.ex is not None:
            r.ex.resume()

    # --- httptools callbacks -------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.cur = Req(self)
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.cur.url += url  # type: ignore[union-attr]
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.cur.headers.append((name, value))  # type: ignore[union-attr]
        self._count_head(len(name) + len(value))

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD:
            raise Answer(431, error_body(431, f"the request's head is over {MAX_HEAD // 1024} KiB"),
                         close=True)

    def on_headers_complete(self) -> None:
        r = self.cur
        assert r is not None
        p = self.parser
        r.method = p.get_method()
        r.http11 = p.get_http_version() == "1.1"
        r.keep_alive = p.should_keep_alive()
        path = r.path
        r.proxied = path.startswith(b"/v1/") and not (path == b"/v1/models" and r.method in (b"GET", b"HEAD"))
        expect = r.header(b"expect")
        r.expect = expect is not None and expect.lower() == b"100-continue"
        cl = r.header(b"content-length")
        if cl is not None and cl.strip().isdigit() and int(cl) > MAX_BODY:
            raise too_large()
        r.answer = self.door.admit(r, self.loopback)
        if r.expect and self.active is None and not self.queue:
            if r.answer is not None:
                raise Answer(r.answer.status, r.answer.body, r.answer.headers, close=True)  # no body will be read
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        r = self.cur
        r.size += len(body)  # type: ignore[union-attr]
        if r.size > MAX_BODY:  # type: ignore[union-attr]
            raise too_large()
        r.body.append(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        r, self.cur = self.cur, None
        self.queue.append(r)  # type: ignore[arg-type]
        if self.active is None:
            self._next()
        elif len(self.queue) >= MAX_QUEUED and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    # --- answering -----------------------------------------------------------------------------------
    def _next(self) -> None:
        if self._in_next:
            return
        self._in_next = True
        try:
            while self.queue and self.active is None and not self.closed:
                r = self.active = self.queue.popleft()
                if r.answer is not None:
                    self.respond(r, r.answer)
                    continue
                try:
                    self.door.dispatch(r)
                except Answer as a:
                    self.respond(r, a)
            if self.reading_paused and len(self.queue) < MAX_QUEUED and not self.closed:
                self.reading_paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]
        finally:
            self._in_next = False

    def finished(self, r: Req) -> None:
        """`r` was answered in full: the next pipelined request, or close when it asked to."""
        r.finished = True
        if self.active is r:
            self.active = None
        if not r.keep_alive:
            self.close()
            return
        self.last = time.monotonic()
        self._next()

    def respond(self, r: Req, a: Answer) -> None:
        """A whole response the door makes itself (JSON)."""
        body = json.dumps(a.body).encode()
        keep = r.keep_alive and not a.close
        r.keep_alive = keep
        r.status = a.status
        head = [b"HTTP/1.1 %d %s\r\n" % (a.status, REASONS.get(a.status, b"")),
                b"Content-Type: application/json; charset=utf-8\r\n",
                b"Content-Length: %d\r\n" % len(body)]
        head += [f"{k}: {v}\r\n".encode() for k, v in a.headers.items()]
        if not keep:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        if self.transport is not None and not self.closed:
            self.transport.write(b"".join(head) + (b"" if r.method == b"HEAD" else body))
        self.finished(r)

    def _refuse_now(self, a: Answer) -> None:
        """An answer from the parser's callbacks (a bad head, a body too large): given at once, and the
        connection closed, since the rest of the bytes cannot be trusted to frame a next request."""
        r = self.cur or Req(self)
        self.cur = None
        if self.active is None:
            self.queue.clear()
            self.active = r
            self.respond(r, Answer(a.status, a.body, a.headers, close=True))
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()  # what was written still goes out first


class Front:
    """The listening socket and its connections."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self.conns: set[Conn] = set()
        self.server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Conn(self.door, self), host, port, backlog=1024,
                                               reuse_address=True)
        self._sweeper = loop.create_task(self._sweep(), name="door-keepalive")
        return self.server.sockets[0].getsockname()[1]

    async def _sweep(self, every_s: float = 5.0) -> None:
        """Close client connections with no request in flight that sent nothing for KEEPALIVE_S (idle
        between requests, or stalled half-way through sending one)."""
        while True:
            await asyncio.sleep(every_s)
            now = time.monotonic()
            for c in list(self.conns):
                if c.active is None and not c.queue and now - c.last > KEEPALIVE_S:
                    c.close()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            self.server.close()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.abort()
        self.conns.clear()


def too_large() -> Answer:
    return Answer(413, error_body(413, f"the request body is over {MAX_BODY // 1024**2} MiB"), close=True)


def answer_refusal(r: Refusal) -> Answer:
    headers = {"Retry-After": str(int(max(1, round(r.retry_after_s))))} if r.retry_after_s else {}
    return Answer(r.status, error_body(r.status, r.message, r.hint, cause=r.cause), headers)
