"""One client request of the door's (door/front.py parses it, within the door's limits): what was
parsed, the `Handler` it is handed to, and how its answer is written: the engine's head with its body
piped after it (the request is the relay's listener), a whole answer the door makes itself, or an event
stream. Framing (length, chunked, or until close for an HTTP/1.0 client) is decided here, once per
answer, from the request and the response's head."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterable, Protocol

from servedeck.door.relay import END_CHUNK, Exchange, UpstreamError
from servedeck.errors import DoorError

HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
       b"transfer-encoding", b"upgrade", b"host", b"content-length", b"authorization", b"x-api-key",
       b"expect", b"proxy-connection", b"http2-settings"}  # the door answers Expect: 100-continue itself
RESP_DROP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length"}
REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
           405: b"Method Not Allowed", 408: b"Request Timeout", 413: b"Payload Too Large", 429: b"Too Many Requests",
           431: b"Request Header Fields Too Large", 499: b"Client Closed Request", 500: b"Internal Server Error",
           502: b"Bad Gateway",
           503: b"Service Unavailable", 504: b"Gateway Timeout"}


def error_body(status: int, message: str, hint: str | None = None, **extra: Any) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
            413: "invalid_request_error",
            429: "rate_limit_error", 431: "invalid_request_error"}.get(status, "server_error")
    err = {"message": message, "type": kind, "code": status}
    if hint:
        err["hint"] = hint
    err.update({k: v for k, v in extra.items() if v is not None})
    return {"error": err}


class Answer(DoorError):
    """A response the door makes itself (an error), raised where it is decided."""

    def __init__(self, status: int, body: dict, headers: dict[str, str] | None = None, close: bool = False):
        self.status, self.body, self.headers, self.close = status, body, headers or {}, close


JOIN_BELOW = 1 << 16  # a body smaller than this leaves in one write with its head; a larger one after it


def upstream_request(r: Req, host: bytes, body: bytes | bytearray) -> bytes | tuple[bytes, bytes | bytearray]:
    """The request as the upstream gets it: target and headers as the client sent them (hop-by-hop
    ones and the door's own key dropped), Host the upstream's, the body's length. A large body is not
    copied behind its head: (head, body), written one after the other (a 200 MiB body joined to its
    head cost another 200 MiB, issue 48)."""
    method = b"GET" if r.method == b"HEAD" else r.method  # httptools cannot read a bodiless HEAD answer:
    parts = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, r.url, host)]  # GET, body dropped (on_head)
    parts += [k + b": " + v + b"\r\n" for k, v in r.headers if k.lower() not in HOP]
    if body or r.method in (b"POST", b"PUT", b"PATCH"):
        parts.append(b"Content-Length: %d\r\n" % len(body))
    parts.append(b"\r\n")
    if len(body) >= JOIN_BELOW:
        return b"".join(parts), body
    parts.append(body)
    return b"".join(parts)


class Handler(Protocol):
    """What the connection hands its requests to (see the module's docstring)."""

    def admit(self, r: Req) -> Answer | None: ...
    def handle(self, r: Req) -> None: ...
    def ended(self, r: Req, ex: Exchange) -> None: ...
    def failed(self, r: Req, ex: Exchange | None, exc: UpstreamError) -> None: ...
    def gone(self, r: Req) -> None: ...


class Connection(Protocol):
    """What a request needs of the client connection it came on (door/front.py's `Conn`)."""

    transport: asyncio.Transport | None
    closed: bool
    peer_host: str | None
    handler: Handler

    def finished(self, r: Req) -> None: ...
    def close(self) -> None: ...


class Req:
    """One client request: what was parsed, and how its answer is going. The relay's listener.
    `proxied`, `model`, `rep`, `entry` and `waited` are the handler's, kept here to save an object."""

    __slots__ = ("conn", "t0", "method", "url", "headers", "body", "size", "keep_alive", "http11", "expect",
                 "proxied", "answer", "model", "rep", "ex", "task", "entry", "status", "head_sent",
                 "chunked", "finished", "waited", "rewrite", "counted")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.t0 = time.perf_counter()
        self.method = b""
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes | bytearray] = []  # what was read of the body: one piece (door/front.py's on_body)
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
        self.rewrite = None  # a body rewriter for the engine's response (door/logprobs.py), rarely set
        self.counted = 0  # bytes of its body counted against the door's body budget (door/front.py)

    @property
    def path(self) -> bytes:
        return self.url.split(b"?", 1)[0]

    @property
    def peer_host(self) -> str | None:
        return self.conn.peer_host

    @property
    def gone(self) -> bool:
        """The client's connection is closed: nothing written now reaches it."""
        return self.conn.closed

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    # --- response heads --------------------------------------------------------------------------------
    def _head(self, status: int, reason: bytes, headers: Iterable[tuple[bytes, bytes]], length: int | None,
              extra: bytes = b"") -> bytes:
        """The response's head; decides how its body is framed: by `length`, chunked (HTTP/1.1), or
        by closing the connection (an HTTP/1.0 client). Sets `status`, `chunked`, `keep_alive`."""
        self.status = status
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason or REASONS.get(status, b""))]
        lines += [b"%s: %s\r\n" % (k, v) for k, v in headers]
        if length is not None:
            lines.append(b"Content-Length: %d\r\n" % length)
        elif self.method == b"HEAD" or status in (204, 304):
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
        if extra:
            lines.append(extra)
        lines.append(b"\r\n")
        self.head_sent = True
        return b"".join(lines)

    def _write(self, data: bytes) -> None:
        t = self.conn.transport
        if t is not None and not self.conn.closed:
            t.write(data)

    # --- whole answers and event streams (the door's own) ----------------------------------------------
    def respond(self, a: Answer) -> None:
        """A whole response the door makes itself (JSON)."""
        if a.close:
            self.keep_alive = False
        self.respond_body(a.status, b"application/json; charset=utf-8", json.dumps(a.body).encode(),
                          [(k.encode(), v.encode()) for k, v in a.headers.items()])

    def respond_body(self, status: int, content_type: bytes, body: bytes,
                     headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        """A whole response with its length; the next request follows."""
        if self.finished:
            return
        head = self._head(status, b"", [(b"Content-Type", content_type), *headers], len(body))
        self._write(head if self.method == b"HEAD" else head + body)
        self.conn.finished(self)

    def open_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The head of a response whose body follows in pieces (`send`), until `end`."""
        self._write(self._head(status, b"", headers, None))

    def send(self, data: bytes) -> None:
        if data and self.method != b"HEAD":
            self._write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)

    def end(self) -> None:
        if self.finished:
            return
        if self.chunked and self.method != b"HEAD":
            self._write(END_CHUNK)
        self.conn.finished(self)

    def unsent(self) -> int:
        """Bytes written to the client and not yet sent (a client that stops reading lets them grow)."""
        t = self.conn.transport
        return t.get_write_buffer_size() if t is not None else 0

    # --- the relay's listener ------------------------------------------------------------------------
    def on_head(self, ex: Exchange) -> None:
        if self.finished:
            return
        length = ex.length
        if self.rewrite is not None and 200 <= ex.status < 300:
            ex.rewrite, length = self.rewrite, None  # rewritten bodies change length: chunked to the client
        head = self._head(ex.status, ex.reason, [(k, v) for k, v in ex.headers if k.lower() not in RESP_DROP],
                          length, self.waited)
        # the head leaves with the first body piece
        ex.pipe(self.conn.transport, self.chunked, head, body=self.method != b"HEAD")

    def on_end(self, ex: Exchange) -> None:
        if self.finished:
            return
        self.ex = None
        self.conn.handler.ended(self, ex)
        self.conn.finished(self)

    def on_fail(self, ex: Exchange | None, exc: UpstreamError) -> None:
        if self.finished:
            return
        self.ex = None
        self.conn.handler.failed(self, ex, exc)

    def retrying(self, task: asyncio.Task) -> None:
        self.task = task
        self.ex = None

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
        # A blank line first: it ends an event the cut left half-written (which then fails to parse on
        # its own instead of swallowing the error event); SSE parsers skip a blank line otherwise.
        events = b"\n\ndata: %b\n\ndata: [DONE]\n\n" % json.dumps(error).encode()
        self._write(b"%x\r\n%b\r\n%b" % (len(events), events, END_CHUNK) if self.chunked else events)
        self.conn.finished(self)

    def cut(self) -> None:
        """Close the client's connection now: it sees an incomplete response, not a clean end."""
        self.conn.close()
