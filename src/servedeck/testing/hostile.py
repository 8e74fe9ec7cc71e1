"""Hostile clients of a server, and a bystander that times it meanwhile: what the door's limits are
measured with (tests/door/test_door_limits.py, bench/door_limits.py). Raw sockets, because a client
library would not send these: it reads its answers, and keeps its headers small.

    pipeline(port, request, total, seconds)   one connection sending `request` over and over, reading
                                              nothing; the socket is handed back open
    huge_header(port, value_mib)              one request whose one header value is that large
    Bystander(url, pid, headers)              another client timing GET /v1/models every `every_s`,
                                              and the server's RSS sampled beside it (psutil)
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from dataclasses import dataclass

import httpx
import psutil


@dataclass
class Pipelined:
    sock: socket.socket  # still open: what the server answered waits in it
    sent: int  # bytes the server's side took (the kernel's buffers, then the server)
    blocked_after: int | None  # bytes sent when a send first waited a whole `block_s` (None: never)


def pipeline(port: int, request: bytes, total: int, seconds: float, block_s: float = 0.5) -> Pipelined:
    """Send `request` back to back on one connection until `total` bytes went or `seconds` passed,
    reading nothing."""
    blob = request * max(1, 65536 // len(request))
    c = socket.create_connection(("127.0.0.1", port))
    c.settimeout(block_s)
    sent, blocked = 0, None
    t0 = time.monotonic()
    while sent < total and time.monotonic() - t0 < seconds:
        try:
            sent += c.send(blob)
        except socket.timeout:  # the server stopped reading: what it would not take waits in the kernel
            blocked = sent if blocked is None else blocked
    return Pipelined(c, sent, blocked)


def huge_header(port: int, value_mib: int, wait_s: float = 5.0) -> tuple[float | None, bytes]:
    """Send `GET /v1/models` whose `X-Huge` header value is `value_mib` MiB, from a thread, and read
    the answer's head: (seconds from the first byte sent to the answer's first bytes, or None when
    nothing came within `wait_s`; what came). The connection is then shut and closed."""
    c = socket.create_connection(("127.0.0.1", port))
    started = threading.Event()

    def send() -> None:
        try:
            c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: door\r\nX-Huge: ")
            started.set()
            piece = b"a" * 2**20
            for _ in range(value_mib):
                c.sendall(piece)
            c.sendall(b"\r\n\r\n")
        except OSError:  # the server refused and closed: the rest is not sent
            pass
        finally:
            started.set()

    t0 = time.perf_counter()
    th = threading.Thread(target=send, daemon=True)
    th.start()
    started.wait(10)
    c.settimeout(wait_s)
    got, took = b"", None
    try:
        while b"\r\n\r\n" not in got:
            piece = c.recv(65536)
            if not piece:
                break
            took = took or time.perf_counter() - t0
            got += piece
    except (socket.timeout, ConnectionResetError):  # no answer in time; or the reset came before it
        pass
    try:
        c.shutdown(socket.SHUT_RDWR)  # wakes the sender
    except OSError:
        pass
    c.close()
    th.join(60)
    return took, got


class Bystander:
    """Another client asking GET /v1/models every `every_s` on a connection of its own, timing each
    answer, and process `pid`'s RSS sampled every `every_s / 2`."""

    def __init__(self, url: str, pid: int, headers: dict[str, str] | None = None, every_s: float = 0.1) -> None:
        self.url, self.headers, self.every_s = url, headers or {}, every_s
        self.ps = psutil.Process(pid)
        self.rss0 = self.peak = self.ps.memory_info().rss
        self.times: list[float] = []
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True),
                        threading.Thread(target=self._rss, daemon=True)]
        for t in self.threads:
            t.start()

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=60) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = c.get("/v1/models")
                    if r.status_code != 200:
                        self.failed.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                self.times.append(time.perf_counter() - t0)
                self.stop.wait(self.every_s)

    def _rss(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.ps.memory_info().rss)
            self.stop.wait(self.every_s / 2)

    def done(self) -> dict:
        """Stop, and say: rss_before and rss_peak (bytes), grew, the answers' times (s), their median
        and max, and what failed."""
        self.stop.set()
        for t in self.threads:
            t.join(120)
        self.peak = max(self.peak, self.ps.memory_info().rss)
        ts = self.times
        return {"rss_before": self.rss0, "rss_peak": self.peak, "grew": self.peak - self.rss0, "times": ts,
                "median_s": statistics.median(ts) if ts else None, "max_s": max(ts) if ts else None,
                "failed": self.failed}
