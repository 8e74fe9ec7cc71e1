"""Async streaming client for OpenAI-compatible `/v1/chat/completions` and `/v1/completions`.

Hand-written on asyncio.BufferedProtocol rather than aiohttp because the timestamp has to be
taken as the bytes arrive, before any parsing or task wake-up: aiohttp at 256 streams measured
TTFT up to 51 ms late (p99; 0.3 ms here) on 64 % of a core (26 % here); docs/loadgen.md,
bench/loadgen_accuracy.py (which runs it beside the aiohttp client). The framing is httptools'
(response.py); only the connection pool, the send and the arrival timestamp are written here.

Errors raised here never escape `send`: connection refused, timeouts, HTTP errors, broken or
malformed streams all end up in the record as status="error" with the reason in `error`.
Cancelling `send` marks the record "cancelled", closes its connection, and re-raises.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from servedeck.config.schema import merge_request
from servedeck.loadgen.records import RequestRecord, RequestSpec
from servedeck.loadgen.response import ERROR_BODY, ProtocolError, Response

Api = Literal["chat", "completions"]


class Streamer(Protocol):
    """The one method the schedule needs: fill `record` by sending `spec` (times relative to t0)."""

    async def send(self, spec: RequestSpec, record: RequestRecord, t0: float) -> None: ...


@dataclass(frozen=True)
class ClientConfig:
    base_url: str  # "http://host:port" or "http://host:port/v1"
    model: str
    api: Api = "chat"
    # Benchmarks need the requested output length, not whenever the model decides to stop;
    # vLLM, SGLang and llama.cpp all accept ignore_eos.
    ignore_eos: bool = True
    # vLLM's per-chunk token counts ("chunks are not tokens"); other servers ignore it.
    continuous_usage_stats: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    api_key: str | None = None
    connect_timeout_s: float = 10.0
    request_timeout_s: float | None = 600.0
    # Cap on requests in flight through this client. A request waiting for a slot is not yet
    # sent, so the wait shows up as schedule lag instead of hiding inside its latency.
    max_connections: int | None = None

    def __post_init__(self) -> None:
        u = urlsplit(self.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/v1], got {self.base_url!r}")
        if self.api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', got {self.api!r}")
        if self.connect_timeout_s <= 0 or (self.request_timeout_s is not None and self.request_timeout_s <= 0):
            raise ValueError("timeouts must be positive")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive TCP connection. States: open-idle (in the pool), open-busy (one request,
    `parser` set), closed (`closed`). The client moves idle/busy; only the transport closes it."""

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf  # the client's receive buffer, shared by its connections
        self.transport: asyncio.Transport | None = None
        self.parser: Response | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.failure: str | None = None
        # The server closed before answering at all: on a reused connection that means its
        # keep-alive ran out, not that the request failed.
        self.dropped_unanswered = False
        self.t0 = 0.0  # run start; arrival times are stored relative to it from the start
        self.t_last = 0.0  # last byte (or the send), relative to t0: how long the request has been quiet
        self.request_id = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        t = perf_counter() - self.t0  # first thing: the arrival time, before any parsing
        self.t_last = t
        p = self.parser
        if p is None:  # bytes nobody asked for: the connection is out of step, drop it
            self._fail("unexpected bytes on an idle connection")
            return
        try:
            p.feed(t, self.buf[:nbytes])  # httptools reads the shared buffer in place; callbacks copy out
        except (ProtocolError, ValueError) as e:
            self._fail(f"protocol error: {e}")
            return
        if p.done:
            self._wake()

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost decides what it meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        p = self.parser
        if p is not None and not p.done and not p.eof(perf_counter() - self.t0):
            self.dropped_unanswered = self.failure is None and p.t_first_byte is None
            self.failure = self.failure or (f"connection lost: {exc}" if exc else "server closed the connection")
        self._wake()

    def _fail(self, why: str) -> None:
        self.failure = self.failure or why
        self.close()
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class StreamingClient:
    """Lifecycle: open (after construction) → closed (`aclose`); `send` on a closed client
    raises RuntimeError. Connections are pooled and reused; the pool grows to the concurrency
    the schedule asks for (call `prewarm(n)` to open them before the clock starts)."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        u = urlsplit(config.base_url)
        self._host = u.hostname or ""
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        self.root = u.path.rstrip("/")  # what a path such as "/v1/models" is appended to
        base = self.root
        if not base.endswith("/v1"):
            base += "/v1"
        self._path = base + ("/chat/completions" if config.api == "chat" else "/completions")
        self._host_header = self._host if u.port is None else f"{self._host}:{u.port}"
        self._head = self.request_head("POST", self._path, "text/event-stream")
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._slots = asyncio.Semaphore(config.max_connections) if config.max_connections else None
        self._closed = False
        # One receive buffer for all of this client's connections (they live on one event loop,
        # whose callbacks run one at a time, and each copies its bytes out at once). asyncio's
        # plain Protocol path allocates a fresh 256 KiB bytes object per recv instead: measured
        # 30 µs a read against 5 µs with recv_into this buffer.
        self._buf = memoryview(bytearray(256 * 1024))

    def request_head(self, method: str, path: str, accept: str) -> str:
        """The request line and this client's headers, without the final CRLF (callers add theirs)."""
        c = self.config
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._host_header}",
            "Content-Type: application/json",
            f"Accept: {accept}",
            "User-Agent: servedeck-loadgen",
        ]
        if c.api_key:
            lines.append(f"Authorization: Bearer {c.api_key}")
        lines += [f"{k}: {v}" for k, v in c.headers.items()]
        return "\r\n".join(lines)

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        """The JSON body sent for `spec` (exposed so callers can log exactly what was asked)."""
        c = self.config
        body: dict[str, Any] = {"model": c.model, "max_tokens": spec.max_tokens, "stream": True}
        opts: dict[str, Any] = {"include_usage": True}
        if c.continuous_usage_stats:
            opts["continuous_usage_stats"] = True
        body["stream_options"] = opts
        if c.api == "chat":
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        if c.ignore_eos:
            body["ignore_eos"] = True
        return merge_request(body, dict(c.extra_body))

    def _request_bytes(self, spec: RequestSpec) -> bytes:
        payload = json.dumps(self.body(spec), ensure_ascii=False).encode()
        head = f"{self._head}\r\nX-Request-Id: {spec.id}\r\nContent-Length: {len(payload)}\r\n\r\n"
        return head.encode() + payload

    def in_flight(self) -> list[tuple[str, float, int, "_Connection"]]:
        """(request id, seconds since its last byte or its send, content chunks so far, connection) for
        every request now waiting on the server: what a stall watch looks at."""
        now = perf_counter()
        return [(c.request_id, now - c.t0 - c.t_last, c.parser.chunks, c)
                for c in list(self._all) if c.parser is not None and not c.parser.done and not c.closed]

    @staticmethod
    def end(conn: "_Connection", why: str) -> None:
        """End one in-flight request now; its record says `why` (a stall, say)."""
        conn._fail(why)

    async def prewarm(self, n: int) -> int:
        """Open up to `n` idle connections ahead of time; returns how many are idle now."""
        need = max(0, n - len(self._idle))
        results = await asyncio.gather(*(self._connect() for _ in range(need)), return_exceptions=True)
        for r in results:
            if isinstance(r, _Connection):
                self._idle.append(r)
        return len(self._idle)

    async def aclose(self) -> None:
        self._closed = True
        for c in list(self._all):
            c.close()
        self._all.clear()
        self._idle.clear()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(self._buf), self._host, self._port, ssl=self._ssl),
            self.config.connect_timeout_s,
        )
        self._all.add(conn)
        return conn

    def _release(self, conn: _Connection, reusable: bool) -> None:
        conn.parser = None
        conn.waiter = None
        if reusable and not conn.closed and not self._closed:
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)

    async def send(self, spec: RequestSpec, record: RequestRecord, t0: float) -> None:
        """Send `spec`, stream the answer, fill `record`. Never raises except CancelledError."""
        if self._closed:
            raise RuntimeError("StreamingClient.send after aclose()")
        record.prompt_tokens_expected = spec.prompt_tokens_expected
        await self.exchange(self._request_bytes(spec), record, t0)

    async def exchange(self, payload: bytes, record: RequestRecord, t0: float, *, sse: bool = True,
                       keep_text: bool = False, max_body: int = ERROR_BODY,
                       timeout_s: float | None | str = "config") -> Response | None:
        """Send prebuilt request bytes on a pooled connection and fill `record`; the response comes
        back too (None when none came). `sse`: a 200 must be an event stream (else it is an error);
        `timeout_s` "config" takes the config's request_timeout_s. Never raises except CancelledError."""
        if self._closed:
            raise RuntimeError("StreamingClient.exchange after aclose()")
        timeout = self.config.request_timeout_s if timeout_s == "config" else timeout_s
        acquired = False
        response = None
        try:
            if self._slots is not None:
                await self._slots.acquire()
                acquired = True
            # A pooled connection the server already closed fails before any byte comes back;
            # that is not the request's fault, so it gets exactly one fresh connection.
            for attempt in (0, 1):
                retry, response = await self._attempt(payload, record, t0, attempt == 1,
                                                      Response(max_body, keep_text), sse, timeout)  # type: ignore[arg-type]
                if not retry:
                    break
            return response
        except asyncio.CancelledError:
            if record.status is None:  # cancelled while waiting for a slot or a connection
                _fail(record, t0, "cancelled before it was sent", status="cancelled")
            raise
        finally:
            if acquired and self._slots is not None:
                self._slots.release()

    async def _attempt(self, payload: bytes, record: RequestRecord, t0: float, fresh_only: bool, parser: Response,
                       sse: bool, timeout_s: float | None) -> tuple[bool, Response | None]:
        conn: _Connection | None = None
        reused = False
        while self._idle and not fresh_only:
            c = self._idle.pop()
            if not c.closed and c.transport is not None and not c.transport.is_closing():
                conn, reused = c, True
                break
            self._all.discard(c)
        if conn is None:
            try:
                conn = await self._connect()
            except asyncio.TimeoutError:
                _fail(record, t0, f"connect timeout after {self.config.connect_timeout_s:g} s")
                return False, None
            except OSError as e:
                _fail(record, t0, f"connect failed: {e}")
                return False, None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        conn.parser, conn.waiter, conn.failure, conn.dropped_unanswered = parser, waiter, None, False
        conn.t0 = t0
        conn.request_id = record.id
        conn.t_last = perf_counter() - t0
        timer = None
        if timeout_s is not None:
            timer = loop.call_later(timeout_s, _expire, conn, timeout_s)
        t_send = perf_counter()
        assert conn.transport is not None
        conn.transport.write(payload)
        try:
            await waiter
        except asyncio.CancelledError:
            self._release(conn, reusable=False)
            _finish(record, parser, t0, t_send, "cancelled", "cancelled while in flight")
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if conn.dropped_unanswered and reused and not fresh_only:
            self._release(conn, reusable=False)
            return True, None
        ok = parser.done and conn.failure is None
        self._release(conn, reusable=ok and parser.keep_alive)
        if not ok:
            _finish(record, parser, t0, t_send, "error", conn.failure or "response ended early")
        elif parser.status != 200:
            _finish(record, parser, t0, t_send, "error", f"HTTP {parser.status}: {parser.body_text[:500]}")
        elif sse and not parser.is_sse:
            ctype = parser.headers.get("content-type", "?")
            _finish(record, parser, t0, t_send, "error", f"expected text/event-stream, got {ctype}")
        else:
            _finish(record, parser, t0, t_send, "ok", None)
        return False, parser


def _expire(conn: _Connection, timeout_s: float) -> None:
    conn._fail(f"timeout after {timeout_s:g} s")


def _fail(record: RequestRecord, t0: float, why: str, status: Literal["error", "cancelled"] = "error") -> None:
    record.status = status
    record.error = why
    record.t_end = perf_counter() - t0


def _finish(
    record: RequestRecord, p: Response, t0: float, t_send: float, status: str, error: str | None
) -> None:
    """Copy what the response brought (already in run-relative seconds) into the record."""
    facts = p.facts()
    record.t_send = t_send - t0
    record.http_status = p.status
    record.t_first_byte = p.t_first_byte
    record.chunk_t = facts.chunk_t
    record.chunk_n = facts.chunk_n
    record.chunk_n_from_server = facts.chunk_n_from_server
    record.streamed_tokens = sum(facts.chunk_n)
    record.t_first_token = record.chunk_t[0] if record.chunk_t else None
    record.t_end = p.t_end if p.t_end is not None else perf_counter() - t0
    record.prompt_tokens = facts.prompt_tokens
    record.output_tokens = facts.output_tokens
    record.cached_tokens = facts.cached_tokens
    record.timings = facts.timings
    record.finish_reason = facts.finish_reason
    if status == "ok" and facts.error is not None:
        status, error = "error", f"error in stream: {facts.error}"
    record.status = status  # type: ignore[assignment]
    record.error = error
