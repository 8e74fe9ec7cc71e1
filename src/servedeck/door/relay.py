"""The door's upstream side: raw HTTP/1.1 to the engines, each response piece written to the client's
socket from the engine socket's own callback.

Why not aiohttp's client (what the door used first): each request cost a `ClientRequest` build and
each relayed chunk a task wake-up (`readany()`) and a coroutine write, all on the door's one loop, where a
batched engine's 64 simultaneous chunks (and a closed loop's 64 simultaneous requests) queue. Here a
request is one prebuilt write on a pooled connection, and what one read from the engine brought (the
head, body pieces, the end) one C parse (httptools, uvicorn's parser) and one `transport.write`:
docs/door.md has the figures.

One `Exchange` is one request and its response on a pooled keep-alive connection. It reports to a
listener (the client's request, door/front.py), from inside its own socket callbacks:

    relay.start(url, payload, listener)      # the request's bytes; a pooled connection or a new one
    listener.on_head(ex)                     # ex.status, ex.reason, ex.headers, ex.length (None:
                                             #   chunked, or until close); the listener calls
    ex.pipe(sink, chunked, prefix)           #   and body bytes flow to `sink` from then on
    listener.on_end(ex)                      # the response ended; everything was written to the sink
    listener.on_fail(ex, UpstreamError)      # refused, reset, closed early, or not HTTP
    ex.abort()                               # the client left: close upstream, report nothing

Closing the engine connection is how an engine learns that the client went away (vLLM and llama-server
both cancel the request), so an aborted exchange's connection is never reused.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from servedeck.errors import DoorError

# A pooled connection idle longer than this is closed, not reused: uvicorn (vLLM) closes idle
# keep-alive connections after 5 s, and a request written into a closing socket would be lost.
IDLE_S = 3.0
END_CHUNK = b"0\r\n\r\n"

Key = tuple[str, int, bool]  # (host, port, tls)
Payload = bytes | tuple[bytes, bytes | bytearray]  # a whole request, or its head and a large body (door/request.py)


class UpstreamError(DoorError):
    """The engine's connection failed: refused, reset, or closed before the response ended."""


class Listener(Protocol):
    ex: "Exchange | None"  # set by the relay once the request is written: what to abort if the client leaves
    task: "asyncio.Task | None"  # the connect under way, if any: what to cancel instead

    def on_head(self, ex: "Exchange") -> None: ...
    def on_end(self, ex: "Exchange") -> None: ...
    def on_fail(self, ex: "Exchange | None", exc: UpstreamError) -> None: ...  # None: no connection was made
    def retrying(self, task: asyncio.Task) -> None: ...  # a reused connection was dead: a fresh one is coming


class Exchange(asyncio.Protocol):
    """One connection to an upstream, carrying one request at a time (HTTP/1.1, no pipelining)."""

    def __init__(self, key: Key, relay: Relay) -> None:
        self.key = key
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.paused = False  # reading paused: the client's socket has too much unsent
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.listener: Listener | None = None
        self.payload: Payload = b""
        self.reused = False
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.length: int | None = None
        self.chunked = False
        self.got_bytes = False
        self.has_head = False
        self.complete = False
        self.keep_alive = False
        self.reported = False  # on_end or on_fail was called
        self._interim = False
        self.t_first_body: float | None = None
        self.usage_body = b""
        self._pending: list[bytes] = []  # body that came before pipe()
        self._out: list[bytes] | None = None  # what this read writes to the sink, in one write
        self._sink: asyncio.Transport | None = None
        self._sink_chunked = False
        self._sink_body = True  # False for a HEAD request's answer: the head only
        self.rewrite = None  # a body rewriter the client's request installs at the head (door/logprobs.py)

    # --- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.relay.open += 1

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._out = out = []
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._out = None
            self._fail(UpstreamError(f"the upstream's response is not valid HTTP: {e}"))
            return
        self._out = None
        sink = self._sink
        if out and sink is not None and not sink.is_closing():
            sink.write(out[0] if len(out) == 1 else b"".join(out))
        if self.complete and not self.reported:
            self.reported = True
            if self.listener is not None:
                self.listener.on_end(self)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.relay.open -= 1
        self.relay._forget(self)
        if self.reported or self.listener is None:
            return  # an idle pooled connection the upstream closed: nothing was waiting on it
        if self.has_head and self.length is None and not self.chunked:
            self.complete = True  # no length and not chunked: the body ends when the upstream closes
            self.reported = True
            self.listener.on_end(self)
            return
        if self.reused and not self.got_bytes:  # a kept-alive connection the upstream had closed
            self.relay._retry(self)
            return
        why = f"{type(exc).__name__}: {exc}" if exc else "the upstream closed the connection"
        self._fail(UpstreamError(why + (" mid-response" if self.has_head else " before answering")))

    # --- httptools callbacks -------------------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:  # httptools joins pieces split across reads
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real head follows
            self._interim = True
            self.headers, self.reason = [], b""
            return
        for n, v in self.headers:
            low = n.lower()
            if low == b"content-length":
                try:
                    self.length = int(v)
                except ValueError:
                    pass
            elif low == b"transfer-encoding" and b"chunked" in v.lower():
                self.chunked = True
        if self.chunked:
            self.length = None
        self.has_head = True
        if self.listener is not None:
            self.listener.on_head(self)

    def on_body(self, body: bytes) -> None:
        if self.t_first_body is None:
            self.t_first_body = time.perf_counter()
        if self.rewrite is not None:  # set for the rare request whose body the door rewrites
            body = self.rewrite.feed(body)
            if not body:
                return
        if b"completion_tokens" in body:  # the usage: in the last events of a stream, or the whole body
            self.usage_body = body
        if self._sink is None:
            self._pending.append(body)
        elif self._sink_body:
            self._put(b"%x\r\n%b\r\n" % (len(body), body) if self._sink_chunked else body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.keep_alive = self.parser.should_keep_alive()  # asked now: llhttp forgets once the message ends
        if self.rewrite is not None:
            rest, self.rewrite = self.rewrite.end(), None
            if rest:
                self.on_body(rest)
        self.complete = True
        if self._sink is not None and self._sink_chunked and self._sink_body:
            self._put(END_CHUNK)

    # --- the listener's side -------------------------------------------------------------------------
    def pipe(self, sink: asyncio.Transport, chunked: bool, prefix: bytes = b"", body: bool = True) -> None:
        """From now on every body piece goes to `sink` (the client's socket), chunk-framed when
        `chunked`, after `prefix` (the client's response head) and what already arrived; with
        `body` False (a HEAD request's answer) the body is read and dropped."""
        self._sink, self._sink_chunked, self._sink_body = sink, chunked, body
        if prefix:
            self._put(prefix)
        pending, self._pending = self._pending, []
        for piece in pending if self._sink_body else ():
            self._put(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)

    def pause(self) -> None:
        if self.transport is not None and not self.closed and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed and self.paused:
            self.paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        """Close the upstream connection now and report nothing more: the client left, so the engine
        must stop generating."""
        self.reported = True
        self.listener = None
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        self.relay._forget(self)

    # --- inside ----------------------------------------------------------------------------------------
    def _put(self, b: bytes) -> None:
        if self._out is not None:  # inside data_received: written once the read is parsed
            self._out.append(b)
        elif self._sink is not None and not self._sink.is_closing():
            self._sink.write(b)

    def _fail(self, exc: UpstreamError) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        self.relay._forget(self)
        if not self.reported:
            self.reported = True
            if self.listener is not None:
                self.listener.on_fail(self, exc)


class Relay:
    """Keep-alive connections to the upstreams, one pool per (host, port, tls)."""

    def __init__(self) -> None:
        self.idle: dict[Key, deque[Exchange]] = {}
        self.connecting: set[asyncio.Task] = set()
        self.open = 0  # connections to upstreams now open, pooled or in use (what holds descriptors, at the limit)
        self._keys: dict[str, Key] = {}  # url → key: urlsplit costs more than the rest of a request's routing
        self._tls: ssl.SSLContext | None = None

    @staticmethod
    def key(url: str) -> Key:
        u = urlsplit(url)
        tls = u.scheme == "https"
        return (u.hostname or "127.0.0.1", u.port or (443 if tls else 80), tls)

    @staticmethod
    def host_header(key: Key) -> bytes:
        host, port, tls = key
        return (host if port in (80, 443) else f"{host}:{port}").encode()

    def _key(self, url: str) -> Key:
        key = self._keys.get(url)
        if key is None:
            key = self._keys[url] = self.key(url)
        return key

    def host_for(self, url: str) -> bytes:
        """The Host header for a request to `url`."""
        return self.host_header(self._key(url))

    def start(self, url: str, payload: Payload, listener: Listener) -> Exchange | asyncio.Task:
        """Send `payload` (a whole request) on a pooled connection, or on a new one (a task, whose
        cancellation is the caller's way to give up). What follows reaches `listener`."""
        key = self._key(url)
        ex = self._take_idle(key)
        if ex is not None:
            ex.reused = True
            self._send(ex, payload, listener)
            return ex
        return self._start_connect(key, payload, listener)

    def _start_connect(self, key: Key, payload: Payload, listener: Listener) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._connect_and_send(key, payload, listener))
        self.connecting.add(task)
        task.add_done_callback(self.connecting.discard)
        return task

    def _send(self, ex: Exchange, payload: Payload, listener: Listener) -> None:
        ex.listener, ex.payload = listener, payload
        listener.ex, listener.task = ex, None  # the client's side may abort it now
        assert ex.transport is not None
        if isinstance(payload, tuple):  # (head, a large body): not joined (door/request.py's upstream_request)
            for part in payload:
                ex.transport.write(part)
        else:
            ex.transport.write(payload)

    async def _connect_and_send(self, key: Key, payload: Payload, listener: Listener) -> None:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        try:
            if tls and self._tls is None:
                self._tls = ssl.create_default_context()
            _, ex = await loop.create_connection(lambda: Exchange(key, self), host, port,
                                                 ssl=self._tls if tls else None)
        except OSError as e:
            listener.on_fail(None, UpstreamError(f"cannot connect to {host}:{port}: {e.strerror or e}"))
            return
        self._send(ex, payload, listener)

    def _retry(self, ex: Exchange) -> None:
        """A reused connection closed before a byte came back: once more on a fresh connection."""
        listener, payload = ex.listener, ex.payload
        ex.listener = None
        if listener is not None:
            listener.retrying(self._start_connect(ex.key, payload, listener))

    def _take_idle(self, key: Key) -> Exchange | None:
        q = self.idle.get(key)
        now = time.monotonic()
        while q:
            ex = q.pop()  # the most recently used: least likely to have been closed by the upstream
            if not ex.closed and now - ex.idle_since < IDLE_S:
                return ex
            if not ex.closed and ex.transport is not None:
                ex.closed = True
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
        """After the listener is done with `ex`: pooled when the response ended cleanly and the
        upstream keeps the connection alive; closed otherwise."""
        if ex.complete and ex.keep_alive and not ex.closed and ex._sink is not None:
            ex.resume()  # a slow client may have paused it on the response's last read
            ex._reset()
            ex.idle_since = time.monotonic()
            self.idle.setdefault(ex.key, deque()).append(ex)
        elif not ex.closed and ex.transport is not None:
            ex.closed = True
            ex.listener = None
            ex.transport.close()

    def close(self) -> None:
        for t in list(self.connecting):
            t.cancel()
        for q in self.idle.values():
            for ex in q:
                if ex.transport is not None:
                    ex.transport.close()
        self.idle.clear()
