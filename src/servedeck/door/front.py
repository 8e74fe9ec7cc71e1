"""The door's HTTP/1.1 to its clients, in one place: requests parsed by httptools, and every response
the door writes (the engine's head with its body piped after it, a whole answer, an event stream:
door/request.py, the request's side), each request answered from the socket's own callbacks.

The connection knows nothing of what a request means: it hands each one to a `Handler` (door/server.py's
`Door`), the way the relay hands an engine's response to its `Listener`:

    handler.admit(req)               # its head is read: None, or the Answer it gets instead (keys, loopback)
    handler.handle(req)              # it is read in full: answer it, now or later (may raise Answer)
    handler.ended(req, ex)           # the engine's response it was sent on was written in full
    handler.failed(req, ex, exc)     # ... failed (before its head went out when not req.head_sent)
    handler.gone(req)                # the client left before it was answered, or the handler raised
                                     #   what it did not foresee (then answered 400/500): give back what
                                     #   it took (its task and exchange are already cancelled and aborted)

The handler answers through the request: `req.respond(Answer)`, `req.respond_body(...)`,
`req.open_stream(...)`/`send`/`end`, or by starting an upstream exchange with `req` as its listener.

Why not aiohttp's server for this (what the door used first): every request paid for a handler task,
a `Request`, the middleware and router, a `StreamResponse` and separate writes for the head, the
body and the end. On one event loop that is paid one request after another: a closed loop's 64
simultaneous requests waited ~55 µs each behind each other on the H200 host (docs/door.md). Here a
request for a ready model is parsed, routed, and written to the engine in the read callback that
brought it; the engine's head goes out with the first body piece in one write. A task is made only
when a request must wait (for a boot, a switch, or a new engine connection).

A client cannot make the door hold more than the limits below, however it behaves (docs/door.md,
"Limits", says what happens past each): a head is counted as its bytes arrive, a connection's answers
and the requests read ahead of them are bounded, and past a bound the door stops reading from that
client, as a slow reader of a stream pauses its engine's socket.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable

import httptools

from servedeck.door.checks import cut
from servedeck.door.listen import Listener, bind
# one request and how its answer is written: imported from here by the door's other modules too
from servedeck.door.request import Answer, Handler, Req, error_body, upstream_request  # noqa: F401

log = logging.getLogger("servedeck.door")

# The door's limits per client connection (docs/door.md, "Limits", says what happens past each), and
# across them the body budget (Front.body_budget: [host] body_budget_mib, default_body_budget below):
MAX_HEAD = 64 * 1024  # request line and headers, counted as their bytes arrive
MAX_BODY = 256 * 1024**2
MAX_QUEUED = 8  # pipelined requests read ahead behind the one being answered, before reading pauses
MAX_AHEAD_BODY = 1 << 20  # ... and the bytes of their bodies (the request being answered may take MAX_BODY)
FEED_SLICE = 16 * 1024  # a long read is parsed this much at a time, so reading ahead stops within a slice
KEEPALIVE_S = 75.0  # an idle client connection is closed after this long (aiohttp's default)
HEAD_TIMEOUT_S = 60.0  # a request head must arrive whole within this long of its first byte (nginx's default)
STALLED_READER_S = 60.0  # a client that takes none of its answer's bytes for this long is cut (nginx's send_timeout)
SWEEP_S = 5.0  # how often those three are checked
WRITE_HIGH, WRITE_LOW = 1 << 20, 1 << 18  # above, a client's answers wait (its engine socket paused); resume below
# JSON bodies are read by Python's json module, whose depth is bounded by the recursion limit (1,000
# frames, less the door's own call depth: 968 levels read on Python 3.11 with uvloop, 961 with asyncio)
NESTING_HINT = "nest the JSON body less deeply: the door reads about 960 levels"


class Conn(asyncio.Protocol):
    """One client connection: requests parsed as they come, answered one after another.

    What a connection makes the door hold is bounded (the limits at the top of this module), however
    its client behaves. While WRITE_HIGH of answers wait for the client to take them, no further
    request of it is answered; while MAX_QUEUED requests (or MAX_AHEAD_BODY of their bodies) wait
    behind the one being answered, nothing more of what it sent is parsed, and reading from it pauses:
    the rest waits in the kernel's buffers, then in the client (back-pressure). Reading resumes once the
    answers ahead are taken."""

    def __init__(self, handler: Handler, front: Front) -> None:
        self.handler = handler
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer_host: str | None = None
        self.cur: Req | None = None  # being parsed
        self.queue: deque[Req] = deque()  # parsed, waiting for the one before to be answered
        self.active: Req | None = None
        self.closed = False
        self.reading_paused = False
        self.writing_paused = False  # WRITE_HIGH waits unsent to the client: no next answer until it drains
        self.paused_at = 0.0  # when writing paused (STALLED_READER_S)
        self.unparsed: bytes | memoryview | None = None  # what was read past the read-ahead bound, kept as is
        self.in_head = False  # the parser is inside a request's head
        self.heads = 0  # heads begun: tells a head that goes on from one that began in the same piece
        self.head_bytes = 0  # the head's target and header bytes, as the parser hands them over
        self.head_read = 0  # bytes of the pieces that fell wholly inside the head (a long header still arriving)
        self.upgrading: Req | None = None  # asked to upgrade and has a body: read after a made-up head
        self.upgrade_frame = b""  # that head's framing line (the request's own Content-Length, or chunked)
        self.resuming: Req | None = None  # the request that made-up head hands back to
        self.tunnel = False  # a CONNECT was read: what follows is not HTTP
        self.last = time.monotonic()
        self._in_next = False

    # --- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        self.peer_host = peer[0] if isinstance(peer, tuple) else None
        self.front.conns.add(self)

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.unparsed is None and self.active is None and not self.queue and len(data) <= FEED_SLICE:
            # the usual read (a request, nothing ahead of it): fed whole, here, as the hot path it is
            heads, in_head = self.heads, self.in_head
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserUpgrade, httptools.HttpParserError) as e:
                self._stopped(e, data, 0)
                return
            if in_head and self.in_head and self.heads == heads:  # all of it was one head, still arriving
                self._head_goes_on(len(data))
            elif self.queue and self._held():  # pipelined requests in this one read
                self._pause_reading()
            return
        if self.unparsed is not None:  # not expected (reading pauses when something is kept): keep the order
            data, self.unparsed = bytes(self.unparsed) + data, None
        self._parse(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.conns.discard(self)
        r = self.active
        self.active = None
        for q in (r, self.cur, *self.queue):  # their bodies leave the budget with them
            if q is not None and q.counted:
                self._uncount(q)
        self.queue.clear()
        self.unparsed = self.upgrading = self.resuming = None
        if r is not None and not r.finished:
            if r.task is not None:
                r.task.cancel()  # waiting for a model, connecting, or streaming events: that ends
            if r.ex is not None:
                r.ex.abort()  # the engine sees its connection close and stops generating
                r.ex = None
            r.status = 499
            self.handler.gone(r)

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.paused_at = time.monotonic()
        r = self.active
        if r is not None and r.ex is not None:
            r.ex.pause()

    def resume_writing(self) -> None:
        self.writing_paused = False
        r = self.active
        if r is not None and r.ex is not None:
            r.ex.resume()
        self._next()

    # --- parsing, within the read-ahead bound ----------------------------------------------------------
    def _parse(self, data: bytes | memoryview) -> None:
        """Parse `data`: whole when it is short (one request, usually), else FEED_SLICE at a time,
        stopping where reading ahead reaches its bound; the rest is kept unparsed and reading pauses
        until the answers ahead are taken (`_next`)."""
        n = len(data)
        view: memoryview | None = None
        i = 0
        t = self.transport
        while i < n and t is not None and not t.is_closing():
            if self._held():
                self.unparsed = data if i == 0 else (view or memoryview(data))[i:]
                self._pause_reading()
                return
            if i == 0 and n <= FEED_SLICE:
                piece = data
            else:
                view = view or memoryview(data)
                piece = view[i:i + FEED_SLICE]
            heads, in_head = self.heads, self.in_head
            try:
                self.parser.feed_data(piece)
            except (httptools.HttpParserUpgrade, httptools.HttpParserError) as e:
                self._stopped(e, view if view is not None else data, i)
                return
            i += len(piece)
            if in_head and self.in_head and self.heads == heads and not self._head_goes_on(len(piece)):
                return
        if self._held():
            self._pause_reading()

    def _stopped(self, e: Exception, data: bytes | memoryview, at: int) -> None:
        """The parser stopped in the piece of `data` that starts at `at`: after a request that asked to
        upgrade (ignored: parsing goes on after it), or at what is not HTTP (refused, closed)."""
        if isinstance(e, httptools.HttpParserUpgrade):
            if self._upgrade_ignored():
                self._parse(memoryview(data)[at + e.args[0]:])
            return
        cause = e.__context__
        self._refuse_now(cause if isinstance(cause, Answer) else
                         Answer(400, error_body(400, f"not a valid HTTP/1.1 request: {e}"), close=True))

    def _head_goes_on(self, n: int) -> bool:
        """`n` more bytes of a head still arriving; False when that took it past MAX_HEAD (refused)."""
        self.head_read += n
        if self.head_read > MAX_HEAD:
            self._refuse_now(head_too_large())
            return False
        return True

    def _held(self) -> bool:
        """Reading ahead is at its bound: requests wait behind the one being answered and either the
        client's answers wait for it, or MAX_QUEUED requests are parsed, or their bodies (with the one
        being read) pass MAX_AHEAD_BODY. The request being answered may take MAX_BODY on its own."""
        if self.active is None and not self.queue:
            return False
        if self.writing_paused or len(self.queue) >= MAX_QUEUED:
            return True
        cur = self.cur
        ahead = cur.size if cur is not None else 0
        for r in self.queue:
            ahead += r.size
        return ahead > MAX_AHEAD_BODY

    def _pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def _asks_upgrade(self, r: Req) -> None:
        """`r` asked to switch protocols. llhttp will take its head as the whole request and what follows
        as the new protocol's: note what it takes to go on in HTTP/1.1 (`_upgrade_ignored`)."""
        if r.method == b"CONNECT":  # a tunnel: answered (the door is no proxy), then closed
            r.keep_alive = False
            self.tunnel = True
            return
        te = r.header(b"transfer-encoding")
        if te is not None and b"chunked" in te.lower():
            self.upgrading, self.upgrade_frame = r, b"Transfer-Encoding: chunked"
            return
        cl = r.header(b"content-length")
        if cl is not None and cl.strip().isdigit() and int(cl) > 0:
            self.upgrading, self.upgrade_frame = r, b"Content-Length: %d" % int(cl)

    def _upgrade_ignored(self) -> bool:
        """The parser stopped after a request that asked to upgrade (`Upgrade: h2c` from `curl --http2`,
        a websocket): the door speaks HTTP/1.1 only, so it answers in HTTP/1.1 and goes on parsing, as
        uvicorn and nginx do, and the client goes on in HTTP/1.1. llhttp skipped such a request's body:
        a made-up head framing it as the request's own head did is fed first, and its headers-complete
        hands the request back, so the same parser reads the body into it. False: parse no further
        (after CONNECT, what follows is a tunnel's bytes)."""
        if self.tunnel:
            self._pause_reading()
            return False
        r, self.upgrading = self.upgrading, None
        if r is not None:
            self.resuming = r
            self.parser.feed_data(b"POST / HTTP/1.1\r\n%b\r\n\r\n" % self.upgrade_frame)
        return True

    # --- httptools callbacks -------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.cur = Req(self)
        self.head_bytes = self.head_read = 0
        self.in_head = True
        self.heads += 1

    def on_url(self, url: bytes) -> None:
        self.cur.url += url  # type: ignore[union-attr]
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.cur.headers.append((name, value))  # type: ignore[union-attr]
        self._count_head(len(name) + len(value))

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD:
            raise head_too_large()

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.resuming is not None:  # the made-up head of an upgrade request's body: the request goes on
            self.cur, self.resuming = self.resuming, None
            return
        r = self.cur
        assert r is not None
        p = self.parser
        r.method = p.get_method()
        r.http11 = p.get_http_version() == "1.1"
        r.keep_alive = p.should_keep_alive()
        expect = r.header(b"expect")
        r.expect = expect is not None and expect.lower() == b"100-continue"
        cl = r.header(b"content-length")
        length = int(cl) if cl is not None and cl.strip().isdigit() else 0
        if length > MAX_BODY:
            raise too_large()
        r.answer = self.handler.admit(r)
        if r.answer is None and length:
            self._count(r, length)  # the whole body, reserved before a byte of it is kept
        if r.expect and self.active is None and not self.queue:
            if r.answer is not None:
                raise Answer(r.answer.status, r.answer.body, r.answer.headers, close=True)  # no body will be read
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
        if p.should_upgrade():
            self._asks_upgrade(r)

    def on_body(self, body: bytes) -> None:
        r = self.cur
        assert r is not None  # a body follows its head
        r.size += len(body)
        if r.size > MAX_BODY:
            raise too_large()
        if r.answer is not None:  # answered instead (401, over the budget): its body is read, not kept
            return
        if r.size > r.counted:  # a chunked body, counted as it comes
            self._count(r, r.size - r.counted)
            if r.answer is not None:
                return
        # One growing buffer, not a list of pieces joined later: the join copied the whole body once more,
        # and a 200 MiB body's pieces, freed after it, stayed in the heap (issue 48: +756 MiB for 200 MiB)
        pieces = r.body
        if not pieces:
            pieces.append(body)
        else:
            first = pieces[0]
            if type(first) is bytes:
                pieces[0] = first = bytearray(first)
            first += body

    def _count(self, r: Req, n: int) -> None:
        """Count `n` more bytes of `r`'s body against the door's budget; past it, `r` is answered 503
        instead, and what it kept is let go (its body is read on and dropped, so the connection goes on)."""
        front = self.front
        if front.bodies + n > front.body_budget:
            front.refused_bodies += 1
            self._uncount(r)
            r.body = []
            r.answer = over_budget(front)
            return
        front.bodies += n
        r.counted += n

    def _uncount(self, r: Req) -> None:
        self.front.bodies -= r.counted
        r.counted = 0

    def on_message_complete(self) -> None:
        r, self.cur = self.cur, None
        if r is self.upgrading:  # its body follows, after the made-up head (_upgrade_ignored)
            self.cur = None
            return
        self.queue.append(r)  # type: ignore[arg-type]
        if self.active is None:
            self._next()

    # --- answering -----------------------------------------------------------------------------------
    def _next(self) -> None:
        """Answer the next request while none is being answered and the client takes its answers;
        parse what was kept unparsed once reading ahead is under its bound again; then read on."""
        if self._in_next:
            return
        self._in_next = True
        try:
            while not self.closed:
                if self.queue and self.active is None and not self.writing_paused:
                    r = self.active = self.queue.popleft()
                    if r.answer is not None:
                        r.respond(r.answer)
                        continue
                    try:
                        self.handler.handle(r)
                    except Answer as a:
                        r.respond(a)
                    except Exception as e:  # noqa: BLE001 - the client gets an answer, not a closed socket
                        self._broke(r, e)
                elif self.unparsed is not None and not self._held():
                    data, self.unparsed = self.unparsed, None
                    self._parse(data)
                else:
                    break
            if self.reading_paused and self.unparsed is None and not self.tunnel and not self.closed \
                    and not self._held():
                self.reading_paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]
        finally:
            self._in_next = False

    def _broke(self, r: Req, e: Exception) -> None:
        """The handler failed on `r` in a way it did not foresee: `r` is answered all the same (400 for a
        request nested past Python's recursion limit, 500 naming the error otherwise) rather than left
        without an answer on a connection that then hangs, and the handler gives back what it took."""
        path = cut(r.path)
        if isinstance(e, RecursionError):
            a = Answer(400, error_body(400, f"{path}: the request is nested too deeply for the door to read",
                                       NESTING_HINT))
        else:
            log.exception("the door failed on %s %s", r.method.decode("latin-1"), path)
            a = Answer(500, error_body(500, f"the door failed on {path}: {type(e).__name__}: {e}",
                                       "a servedeck bug: the door's stderr has the traceback"))
        if r.task is not None:
            r.task.cancel()
            r.task = None
        if r.ex is not None:
            r.ex.abort()
            r.ex = None
        r.status = a.status
        self.handler.gone(r)
        r.respond(a)

    def finished(self, r: Req) -> None:
        """`r` was answered in full: the next pipelined request, or close when it asked to."""
        r.finished = True
        if r.counted:
            self._uncount(r)
        if self.active is r:
            self.active = None
        if not r.keep_alive:
            self.close()
            return
        self.last = time.monotonic()
        self._next()

    def _refuse_now(self, a: Answer) -> None:
        """An answer from the parser's callbacks (a bad head, a body too large): given at once, and the
        connection closed, since the rest of the bytes cannot be trusted to frame a next request."""
        r = self.cur or Req(self)
        self.cur = None
        self.unparsed = None
        if r.counted:
            self._uncount(r)
        if self.active is None:
            self.queue.clear()
            self.active = r
            r.respond(Answer(a.status, a.body, a.headers, close=True))
        else:
            self.close()

    def time_out_head(self) -> None:
        """A head still arriving HEAD_TIMEOUT_S after its first byte (a client trickling it): 408, closed."""
        self._refuse_now(Answer(408, error_body(408, f"the request's head did not arrive within "
                                                     f"{HEAD_TIMEOUT_S:g} s"), close=True))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()  # what was written still goes out first


class Front:
    """The listening socket and its connections."""

    def __init__(self, handler: Handler, body_budget: int | None = None, budget_from: str = "") -> None:
        self.handler = handler
        self.conns: set[Conn] = set()
        self.body_budget = body_budget or default_body_budget()  # bytes of request bodies held at once
        # where the budget was given: "--body-budget-mib", "[host] body_budget_mib", or the default
        self.budget_from = (budget_from or BUDGET_KEY) if body_budget else DEFAULT_BUDGET
        self.bodies = 0  # bytes of request bodies held now (counted from the head's Content-Length, or as read)
        self.refused_bodies = 0
        self.listener: Listener | None = None
        self._sweeper: asyncio.Task | None = None

    async def start(self, host: str, port: int, holders: Callable[[], dict[str, int]] | None = None,
                    say: Callable[[str, str], None] | None = None) -> int:
        """Listen on `host`:`port`; accepting pauses at the descriptor limit (door/listen.py), saying so
        through `say` with what holds the descriptors (`holders` adds the engine connections)."""
        loop = asyncio.get_running_loop()
        self.listener = Listener(bind(host, port), lambda: Conn(self.handler, self),
                                 lambda: {"client connections": len(self.conns), **(holders() if holders else {})},
                                 say or (lambda kind, msg: log.warning("%s", msg)))
        self._sweeper = loop.create_task(self._sweep(), name="door-keepalive")
        return self.listener.port

    async def _sweep(self) -> None:
        """Close client connections with no request in flight that sent nothing for KEEPALIVE_S (idle
        between requests, or stalled half-way through sending one); answer 408 to a head still
        arriving HEAD_TIMEOUT_S after its first byte (trickled in); cut a client that took none of its
        answers' bytes for STALLED_READER_S (what waits for it is dropped, its engine's request ends)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now, pc = time.monotonic(), time.perf_counter()
            for c in list(self.conns):
                if c.writing_paused and now - c.paused_at > STALLED_READER_S and c.transport is not None:
                    c.transport.abort()
                elif c.active is None and not c.queue:
                    if now - c.last > KEEPALIVE_S:
                        c.close()
                    elif c.in_head and c.cur is not None and pc - c.cur.t0 > HEAD_TIMEOUT_S:
                        c.time_out_head()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.listener is not None:
            self.listener.close()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.abort()
        self.conns.clear()


def head_too_large() -> Answer:
    return Answer(431, error_body(431, f"the request's head is over {MAX_HEAD // 1024} KiB"), close=True)


def too_large() -> Answer:
    return Answer(413, error_body(413, f"the request body is over {MAX_BODY // 1024**2} MiB"), close=True)


def default_body_budget() -> int:
    """An eighth of the host's memory (a body costs the door up to about twice its size while it is
    read and routed), and at least one body of MAX_BODY."""
    import psutil

    return max(MAX_BODY, psutil.virtual_memory().total // 8)


BUDGET_FLAG = "--body-budget-mib"
BUDGET_KEY = "[host] body_budget_mib"
DEFAULT_BUDGET = "the default: an eighth of host memory"


def bodies_state(front: Front) -> dict:
    """The body budget and what holds it now, for /door/status."""
    return {"budget_mib": round(front.body_budget / 2**20, 3), "from": front.budget_from,
            "held_mib": round(front.bodies / 2**20, 3), "refused": front.refused_bodies}


def over_budget(front: Front) -> Answer:
    raise_it = {BUDGET_FLAG: f"give serve a larger {BUDGET_FLAG}",
                DEFAULT_BUDGET: f"set body_budget_mib in models.toml's [host] (or serve {BUDGET_FLAG})"}.get(
        front.budget_from, "raise body_budget_mib in models.toml's [host]")
    return Answer(503, error_body(503, f"the door holds {front.bodies / 2**20:,.0f} MiB of request bodies already, "
                                       f"all clients together; its budget is {front.body_budget / 2**20:,.0f} MiB "
                                       f"({front.budget_from})",
                                  f"retry after the Retry-After seconds; or {raise_it}"), {"Retry-After": "2"})
