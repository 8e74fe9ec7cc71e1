"""One HTTP/1.1 response as its bytes arrive: framing by httptools (llhttp, in C), events by sse.py.

`Response.feed(t, data)` runs inside the socket's read callback with the arrival time `t` the
connection took before anything else, so the timestamp never waits for parsing. httptools calls
back into this object (status, headers, body pieces, end) from inside `feed_data`; an SSE body goes
to an `EventStream` piece by piece, tagged with `t`; any other body (an error, a non-streamed
answer) is kept, up to `max_body` bytes.

States only advance: head (before on_headers_complete) → body → done (on_message_complete, or the
server's close for a body that has neither a length nor chunked framing).
"""

from __future__ import annotations

import httptools

from servedeck.loadgen.sse import EventStream, StreamFacts

ERROR_BODY = 16 * 1024  # what a streaming request keeps of a non-SSE body: enough for the error


class ProtocolError(Exception):
    """The server's bytes are not HTTP/1.1."""


class Response:
    __slots__ = ("status", "headers", "keep_alive", "is_sse", "t_first_byte", "t_end", "done", "extra",
                 "events", "_parser", "_t", "_has_head", "_interim", "_until_close", "_body", "_max_body",
                 "_keep_text", "_facts")

    def __init__(self, max_body: int = ERROR_BODY, keep_text: bool = False) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}  # lower-case names; a repeated header's values joined by ", "
        self.keep_alive = True
        self.is_sse = False
        self.t_first_byte: float | None = None
        self.t_end: float | None = None
        self.done = False
        self.extra = False  # bytes came after the response ended: the connection is out of step
        self.events: EventStream | None = None  # set once the head says text/event-stream
        self._parser = httptools.HttpResponseParser(self)
        self._t = 0.0  # arrival time of the read being parsed
        self._has_head = False
        self._interim = False
        self._until_close = False
        self._body = bytearray()
        self._max_body = max_body
        self._keep_text = keep_text
        self._facts: StreamFacts | None = None

    @property
    def body(self) -> bytes:
        return bytes(self._body)

    @property
    def body_text(self) -> str:
        return self._body.decode("utf-8", "replace")

    @property
    def chunks(self) -> int:
        """Content chunks so far (a live count, for progress and stall watches)."""
        return len(self.events.chunk_n) if self.events is not None else 0

    def facts(self) -> StreamFacts:
        """What the events said (decoded once, on first call; empty for a body that was not SSE)."""
        if self._facts is None:
            self._facts = self.events.facts() if self.events is not None else StreamFacts()
        return self._facts

    def feed(self, t: float, data: bytes | memoryview) -> None:
        """Consume bytes that arrived at `t`. Raises ProtocolError on bytes that are not HTTP."""
        if self.t_first_byte is None:
            self.t_first_byte = t
        self._t = t
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.done:  # garbage after a whole response: out of step, not a failed request
                self.extra = True
                self.keep_alive = False
                return
            raise ProtocolError(str(e) or type(e).__name__) from None

    def eof(self, t: float) -> bool:
        """The connection closed; True if that legitimately ended the response."""
        if self._until_close and not self.done:
            self._finish(t)
        return self.done

    def _finish(self, t: float) -> None:
        self.done = True
        self.t_end = t
        if self.events is not None:
            self.events.end(t)

    # --- httptools callbacks (inside feed_data) ---------------------------------------------------
    def on_message_begin(self) -> None:
        if self.done:  # a second response on one request
            self.extra = True
            self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:  # httptools joins pieces split across reads
        if self.done:
            return
        key = name.decode("latin-1").lower()
        v = value.decode("latin-1").strip()
        old = self.headers.get(key)
        self.headers[key] = v if old is None else f"{old}, {v}"

    def on_headers_complete(self) -> None:
        if self.done:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real head follows
            self._interim = True
            self.headers = {}
            return
        self.status = status
        self._has_head = True
        h = self.headers
        self.is_sse = status == 200 and "text/event-stream" in h.get("content-type", "")
        if self.is_sse:
            self.events = EventStream(keep_text=self._keep_text)
        chunked = "chunked" in h.get("transfer-encoding", "").lower()
        self._until_close = not chunked and "content-length" not in h and status not in (204, 304)
        if self._until_close:
            self.keep_alive = False

    def on_body(self, body: bytes) -> None:
        if self.done:
            return
        ev = self.events
        if ev is not None:
            ev.feed(self._t, body)
        elif len(self._body) < self._max_body:
            self._body += body[: self._max_body - len(self._body)]

    def on_message_complete(self) -> None:
        if self.done:
            return
        if self._interim:
            self._interim = False
            return
        # asked now: llhttp forgets once the message ends
        self.keep_alive = self.keep_alive and self._parser.should_keep_alive()
        self._finish(self._t)
