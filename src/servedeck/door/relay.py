"""The door's upstream side: raw HTTP/1.1 to the engine, each response chunk written to the client's
socket from the engine socket's own callback.

Why not aiohttp's client (what the door used first): each request cost a `ClientRequest` build and
each relayed chunk a task wake-up (`readany()`) and a coroutine write, all on the door's one loop, where a
batched engine's 64 simultaneous chunks (and a closed loop's 64 simultaneous requests) queue. Here a
request is one prebuilt write on a pooled connection, and a chunk one C parse (httptools, uvicorn's
parser) and one `transport.write`. On the H200 host, door on two CPUs of its own, the added TTFT at 64
streams went from 2.5 / 17.5 ms to 1.67 / 8.8 ms (p50 / p99), at 256 from 29.2 / 102.8 to 6.7 / 37.0
(docs/door.md).

One `Exchange` is one request and its response on a pooled keep-alive connection:

    ex = await relay.send(url, method, path_qs, headers, body)   # returns once the head is in
    ex.status, ex.reason, ex.headers, ex.length                  # length None: chunked / until close
    ex.pipe(client_transport, chunked=...)                       # body bytes flow from here on
    await ex.done                                                # the response ended (or failed)
    ex.abort()                                                   # the client left: close upstream

Closing the engine connection is how an engine learns that the client went away (vLLM and llama-server
both cancel the request), so an aborted exchange's connection is never reused.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

import httptools

# Client-side buffer above which the engine's socket is paused (a slow reader must not make the door
# hold an unbounded response in memory), and below which it resumes.
HIGH_WATER = 1 << 20
LOW_WATER = 1 << 18
# A pooled connection idle longer than this is closed, not reused: uvicorn (vLLM) closes idle
# keep-alive connections after 5 s, and a request written into a closing socket would be lost.
IDLE_S = 3.0


class UpstreamError(Exception):
    """The engine's connection failed: refused, reset, or closed before the response ended."""


class Exchange(asyncio.Protocol):
    """One connection to an engine, carrying one request at a time (HTTP/1.1, no pipelining)."""

    def __init__(self, key: tuple[str, int, bool], relay: Relay) -> None:
        self.key = key
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False  # carrying a request (False while pooled)
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        loop = asyncio.get_running_loop()
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.length: int | None = None
        self.chunked = False
        self.got_bytes = False
        self.complete = False
        self.keep_alive = False
        self._interim = False
        self.t_first_body: float | None = None
        self.usage_body = b""
        self._pending: list[bytes] = []
        self._sink: asyncio.Transport | None = None
        self._sink_chunked = False
        self._paused = False

    # --- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError(f"the engine's response is not valid HTTP: {e}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.relay._forget(self)
        if self.complete or not self.busy:
            return  # an idle pooled connection the engine closed: nothing was waiting on it
        if self.head.done() and self.length is None and not self.chunked:
            self._end()  # no length and not chunked: the body ends when the engine closes
            return
        why = f"{type(exc).__name__}: {exc}" if exc else "the engine closed the connection"
        self._fail(UpstreamError(why + (" before answering" if not self.head.done() else " mid-response")))

    # --- httptools callbacks -------------------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:  # httptools joins pieces split across reads
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real head follows
            self._interim = True
            self.headers, self.reason = [], ""
            return
        for n, v in self.headers:
            low = n.lower()
            if low == "content-length":
                try:
                    self.length = int(v)
                except ValueError:
                    pass
            elif low == "transfer-encoding" and "chunked" in v.lower():
                self.chunked = True
        if self.chunked:
            self.length = None
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.t_first_body is None:
            self.t_first_body = time.perf_counter()
        if b"completion_tokens" in body:  # the usage: in the last events of a stream, or the whole body
            self.usage_body = body
        sink = self._sink
        if sink is None:
            self._pending.append(body)
        else:
            self._write(sink, body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.keep_alive = self.parser.should_keep_alive()  # asked now: llhttp forgets once the message ends
        self._end()

    # --- the handler's side --------------------------------------------------------------------------
    def pipe(self, sink: asyncio.Transport, chunked: bool) -> None:
        """From now on every body chunk goes straight to `sink` (the client's socket), chunk-framed
        when `chunked`; what arrived before (with the head) goes first."""
        self._sink, self._sink_chunked = sink, chunked
        pending, self._pending = self._pending, []
        for body in pending:
            self._write(sink, body)

    def abort(self, why: Exception | None = None) -> None:
        """Close the engine connection now: the engine stops generating for a client that left."""
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        self.relay._forget(self)
        if not self.done.done():
            self.done.set_exception(why or UpstreamError("aborted"))
            self.done.exception()  # retrieved: nobody may be awaiting it any more

    # --- inside ----------------------------------------------------------------------------------------
    def _write(self, sink: asyncio.Transport, body: bytes) -> None:
        if sink.is_closing():  # the client is gone (its handler is being cancelled too)
            self.abort(ConnectionResetError("the client went away"))
            return
        if self._sink_chunked:  # one write, one segment: writelines() may send each piece on its own
            sink.write(b"%x\r\n%b\r\n" % (len(body), body))
        else:
            sink.write(body)
        if not self._paused and sink.get_write_buffer_size() > HIGH_WATER and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(0.005, self._maybe_resume)

    def _maybe_resume(self) -> None:
        sink = self._sink
        if self.closed or sink is None:
            return
        if sink.is_closing():
            self.abort(ConnectionResetError("the client went away"))
        elif sink.get_write_buffer_size() <= LOW_WATER:
            self._paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        else:
            asyncio.get_running_loop().call_later(0.005, self._maybe_resume)

    def _end(self) -> None:
        self.complete = True
        if not self.head.done():
            self.head.set_exception(UpstreamError("the engine's response ended before its head"))
        if not self.done.done():
            self.done.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        for f in (self.head, self.done):
            if not f.done():
                f.set_exception(exc)
            if not f.cancelled():
                f.exception()  # retrieved: the handler awaiting it still gets it; one that left does not warn



class Relay:
    """Keep-alive connections to the engines, one pool per (host, port, tls)."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, int, bool], deque[Exchange]] = {}
        self._tls: ssl.SSLContext | None = None

    @staticmethod
    def key(url: str) -> tuple[str, int, bool]:
        u = urlsplit(url)
        tls = u.scheme == "https"
        return (u.hostname or "127.0.0.1", u.port or (443 if tls else 80), tls)

    async def _connect(self, key: tuple[str, int, bool]) -> Exchange:
        host, port, tls = key
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            _, ex = await loop.create_connection(lambda: Exchange(key, self), host, port,
                                                 ssl=self._tls if tls else None)
        except OSError as e:
            raise UpstreamError(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
        return ex

    def _take_idle(self, key: tuple[str, int, bool]) -> Exchange | None:
        q = self.idle.get(key)
        now = time.monotonic()
        while q:
            ex = q.pop()  # the most recently used: least likely to have been closed by the engine
            if not ex.closed and now - ex.idle_since < IDLE_S:
                return ex
            if not ex.closed and ex.transport is not None:
                ex.transport.close()
        return None

    def _forget(self, ex: Exchange) -> None:
        q = self.idle.get(ex.key)
        if q:
            try:
                q.remove(ex)
            except ValueError:
                pass

    def release(self, ex: Exchange) -> None:
        """After the handler is done with `ex`: pooled when the response ended cleanly and the engine
        keeps the connection alive; closed otherwise."""
        if ex.complete and ex.keep_alive and not ex.closed and ex._sink is not None:
            ex.idle_since = time.monotonic()
            ex.busy = False
            ex._reset()
            self.idle.setdefault(ex.key, deque()).append(ex)
        elif not ex.closed and ex.transport is not None:
            ex.closed = True
            ex.transport.close()

    async def send(self, url: str, method: str, path_qs: str, headers: list[tuple[str, str]],
                   body: bytes) -> Exchange:
        """Write the request and wait for the response's head. A pooled connection that the engine had
        closed (nothing came back at all) is retried once on a fresh one."""
        key = self.key(url)
        host_header = key[0] if key[1] in (80, 443) else f"{key[0]}:{key[1]}"
        lines = [f"{method} {path_qs} HTTP/1.1", f"Host: {host_header}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        # aiohttp decoded the client's head as UTF-8 with surrogateescape: this gives back its very bytes
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body
        for attempt in (0, 1):
            ex = self._take_idle(key) if attempt == 0 else None
            reused = ex is not None
            if ex is None:
                ex = await self._connect(key)
            ex.busy = True
            assert ex.transport is not None
            ex.transport.write(payload)
            try:
                await ex.head
            except UpstreamError:
                if reused and not ex.got_bytes:
                    continue
                raise
            except asyncio.CancelledError:
                ex.abort()
                raise
            return ex
        raise AssertionError("unreachable")

    def close(self) -> None:
        for q in self.idle.values():
            for ex in q:
                if ex.transport is not None:
                    ex.transport.close()
        self.idle.clear()
