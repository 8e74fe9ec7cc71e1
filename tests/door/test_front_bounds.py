"""The client connection's bounds (door/front.py), without processes or sockets: a `Conn` fed what a
hostile client sends, over a transport that keeps what is written until the test lets the "client"
take it, as asyncio's does (pause_writing above the high mark, resume_writing under the low one).
The same behaviours are tested on a real door and llama-server in test_door_limits.py."""

from __future__ import annotations

import json

import httptools

from servedeck.door import front
from servedeck.door.front import Answer, Conn, Req


class Transport:
    """What the client has not taken yet, asyncio-style flow control, and reading paused or not."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.taken = bytearray()
        self.proto: Conn | None = None
        self.high, self.low = 0, 0
        self.reading = True
        self.closing = False
        self.writing_paused = False

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        self.high, self.low = high, low

    def get_extra_info(self, name: str):
        return ("127.0.0.1", 5555) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.buf += data
        if not self.writing_paused and len(self.buf) > self.high:
            self.writing_paused = True
            self.proto.pause_writing()

    def get_write_buffer_size(self) -> int:
        return len(self.buf)

    def take(self, n: int | None = None) -> None:
        """The client reads `n` bytes (all, when None) of what waits for it."""
        n = len(self.buf) if n is None else n
        self.taken += self.buf[:n]
        del self.buf[:n]
        if self.writing_paused and len(self.buf) <= self.low:
            self.writing_paused = False
            self.proto.resume_writing()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


class Handler:
    """Answers every request at once with a body naming its target (as /v1/models is answered)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def admit(self, r: Req) -> Answer | None:
        return None

    def handle(self, r: Req) -> None:
        self.bodies.append(b"".join(r.body))
        r.respond_body(200, b"application/json", json.dumps({"url": r.url.decode(), "pad": "x" * 1000}).encode())

    def ended(self, r, ex) -> None: ...
    def failed(self, r, ex, exc) -> None: ...
    def gone(self, r) -> None: ...


class FrontStub:
    def __init__(self, body_budget: int = 1 << 40) -> None:
        self.conns: set = set()
        self.body_budget, self.bodies, self.refused_bodies = body_budget, 0, 0
        self.budget_from = "[host] body_budget_mib"


def connection() -> tuple[Conn, Transport, Handler]:
    h, t = Handler(), Transport()
    c = Conn(h, FrontStub())
    t.proto = c
    c.connection_made(t)
    return c, t, h


def responses(data: bytes) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []

    class P:
        body = b""

        def on_body(self, b: bytes) -> None:
            self.body += b

        def on_message_complete(self) -> None:
            got.append((p.get_status_code(), self.body))
            self.body = b""

    p = httptools.HttpResponseParser(P())
    p.feed_data(bytes(data))
    return got


def test_a_client_that_pipelines_and_reads_nothing_is_held_to_the_bounds():
    c, t, h = connection()
    n = 20_000
    wire = b"".join(b"GET /%d HTTP/1.1\r\nHost: d\r\n\r\n" % i for i in range(n))  # ~0.6 MB in one read
    c.data_received(wire)
    one_answer = len(t.buf) - front.WRITE_HIGH  # how far the last answer went past the mark
    assert len(t.buf) <= front.WRITE_HIGH + 1200 and one_answer < 1200  # answers wait: at most one past the mark
    assert not t.reading  # reading paused
    per_request = len(wire) // n
    assert len(c.queue) <= front.MAX_QUEUED + front.FEED_SLICE // per_request  # parsed ahead: the bound, one slice
    assert c.unparsed is not None and len(c.unparsed) > len(wire) // 2  # the rest waits as it came, unparsed
    # the client reads: everything is answered, once each, in order, and reading resumes
    while t.buf or c.queue or c.unparsed is not None:
        t.take()
    assert t.reading
    urls = [json.loads(b)["url"] for _, b in responses(t.taken)]
    assert urls == [f"/{i}" for i in range(n)]


def test_bodies_read_ahead_are_held_to_a_mebibyte_while_an_answer_waits():
    c, t, h = connection()
    t.high = 0  # every answer waits for the client: what follows is all read ahead
    body = b"b" * (256 * 1024)
    post = b"POST /x HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    c.data_received(b"GET /first HTTP/1.1\r\nHost: d\r\n\r\n" + post * 8)
    ahead = sum(r.size for r in c.queue) + (c.cur.size if c.cur is not None else 0)
    assert ahead <= front.MAX_AHEAD_BODY + front.FEED_SLICE
    assert not t.reading and c.unparsed is not None
    t.high = front.WRITE_HIGH
    while t.buf or c.queue or c.unparsed is not None:
        t.take()
    assert h.bodies[1:] == [body] * 8


def test_a_header_value_growing_past_the_limit_is_refused_within_two_slices():
    c, t, h = connection()
    c.data_received(b"GET / HTTP/1.1\r\nX-Huge: ")
    fed = 0
    while not t.closing and fed < 8 * 2**20:
        c.data_received(b"a" * 4096)
        fed += 4096
    assert t.closing, "never refused"
    assert fed <= front.MAX_HEAD + 2 * front.FEED_SLICE
    [(status, body)] = responses(t.buf)
    assert status == 431 and "64 KiB" in json.loads(body)["error"]["message"]
    c2, t2, _ = connection()  # the same in one read of 1 MiB: sliced, refused past the limit
    c2.data_received(b"GET / HTTP/1.1\r\nX-Huge: " + b"a" * 2**20)
    assert t2.closing and responses(t2.buf)[0][0] == 431


def test_an_upgrade_is_ignored_and_a_body_it_carries_is_read():
    c, t, h = connection()
    up = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    c.data_received(b"POST /a HTTP/1.1\r\nHost: d\r\n" + up + b"Content-Length: 5\r\n\r\nhello"
                    b"POST /b HTTP/1.1\r\nHost: d\r\n" + up + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                    b"GET /c HTTP/1.1\r\nHost: d\r\n" + up + b"\r\n")
    assert h.bodies == [b"hello", b"abcde", b""]
    assert [json.loads(b)["url"] for _, b in responses(t.buf)] == ["/a", "/b", "/c"]
    assert not t.closing


def test_an_upgrade_body_split_across_reads_is_read_whole():
    c, t, h = connection()
    c.data_received(b"POST /a HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\nContent-Length: 10\r\n\r\n012")
    c.data_received(b"3456789GET /b HTTP/1.1\r\n\r\n")
    assert h.bodies == [b"0123456789", b""]


def test_connect_is_answered_and_the_tunnel_bytes_after_it_are_not_parsed():
    c, t, h = connection()
    c.data_received(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n\x16\x03\x01 tls bytes")
    [(status, _)] = responses(t.buf)
    assert status == 200 and t.closing  # the stub handler answered; the connection closes after it
    assert len(h.bodies) == 1


def test_what_the_handler_did_not_foresee_is_answered_not_left_silent():
    c, t, h = connection()

    def nested(r: Req) -> None:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    h.handle = nested
    c.data_received(b"POST /v1/x HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]GET /next HTTP/1.1\r\n\r\n")
    got = responses(t.buf)
    assert got[0][0] == 400 and "nested too deeply" in json.loads(got[0][1])["error"]["message"]

    def broken(r: Req) -> None:
        raise KeyError("oops")

    h.handle = broken
    c.data_received(b"GET /v1/y HTTP/1.1\r\n\r\n")
    got = responses(t.buf)
    assert [s for s, _ in got] == [400, 400, 500], got  # /next hit the nested stub too; then the 500
    assert "KeyError" in json.loads(got[2][1])["error"]["message"]
    assert not t.closing



class Holding(Handler):
    """Answers nothing until told: its requests' bodies stay in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Req] = []

    def handle(self, r: Req) -> None:
        self.bodies.append(b"".join(r.body))
        self.held.append(r)


def test_request_bodies_in_flight_are_bounded_door_wide():
    """Issue 48 item 4: memory was bounded per connection only (four 200 MiB bodies at once took the door up
    1,264 MiB). With a budget of 1 MiB across connections, a body that would pass it gets 503 with
    Retry-After, its body read and dropped, and the connection goes on; once the first is answered the
    budget is free again."""
    stub = FrontStub(body_budget=2**20)
    h = Holding()
    conns = []
    for _ in range(2):
        t = Transport()
        c = Conn(h, stub)
        t.proto = c
        c.connection_made(t)
        conns.append((c, t))
    big = b"a" * (768 * 1024)
    post = b"POST /v1/x HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
    conns[0][0].data_received(post)
    assert stub.bodies == len(big) and len(h.held) == 1
    conns[1][0].data_received(post)  # 768 KiB more would pass 1 MiB
    [(status, body)] = responses(conns[1][1].buf)
    assert status == 503 and b"Retry-After: 2" in bytes(conns[1][1].buf), bytes(conns[1][1].buf)[:300]
    assert "budget is 1 MiB" in json.loads(body)["error"]["message"]
    assert len(h.held) == 1 and stub.bodies == len(big) and not conns[1][1].closing
    chunked = b"POST /v1/y HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(big), big)
    conns[1][1].buf.clear()
    conns[1][0].data_received(chunked)  # counted as it comes: refused the same
    assert responses(conns[1][1].buf)[0][0] == 503 and stub.bodies == len(big)
    h.held[0].respond_body(200, b"application/json", b"{}")
    assert stub.bodies == 0
    conns[1][1].buf.clear()
    conns[1][0].data_received(post)  # room again
    assert len(h.held) == 2 and stub.bodies == len(big)
    conns[1][0].connection_lost(None)  # a client that leaves takes its body off the budget
    assert stub.bodies == 0
