"""The door's listening sockets, accepted by the door itself so that it can stop accepting at the
file-descriptor limit and start again, and the limit it runs with.

Why not the event loop's `create_server`: at the limit asyncio logs each failed accept and retries a
second later, and uvloop's server may close itself; neither says what holds the descriptors, and
either lets the last descriptors go to idle clients, so the watch loop's lock file, a boot's log and
the engines' connections then fail (issue 48: `OSError: [Errno 24] Too many open files: '…/deck.lock'`
ended the door). Here accepting pauses while fewer than RESERVE descriptors are left (an accepted
socket's number says it: the kernel hands out the lowest free one), the door says so once with the
limit and what holds them, serves the connections it has, and accepts again once enough are free.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
from typing import Callable

log = logging.getLogger("servedeck.door")

RESERVE = 64  # descriptors kept for what is not a client: engine connections, lock files, logs, threads
RESUME_BELOW = 2 * RESERVE  # accepting resumes once at least this many are free again
CHECK_S = 0.5  # how often a paused door counts its open descriptors
ACCEPTS_PER_READ = 64  # connections accepted per readiness callback: others' callbacks run between
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def raise_nofile() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (every idle client connection takes
    one); returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # RLIM_INFINITY above the kernel's nr_open: keep what there is
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def open_descriptors() -> int:
    """How many descriptors this process holds (Linux's /proc; psutil elsewhere)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opened
    except OSError:
        import psutil

        return psutil.Process().num_fds()


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for `host` (every address it names, as asyncio's create_server binds), on
    `port` (0: a free one, the same for all)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr[0]) in seen:
                continue
            seen.add((family, addr[0]))
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr[0], port, *addr[2:]))
            port = port or s.getsockname()[1]
            s.listen(1024)
            s.setblocking(False)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


class Listener:
    """Accepts on the door's sockets and hands each connection to `protocol()`, pausing at the limit.

    States: accepting (a reader on each socket) → paused (no reader; a timer counts the open
    descriptors every CHECK_S) → accepting, once RESUME_BELOW are free; closed at the end."""

    def __init__(self, socks: list[socket.socket], protocol: Callable[[], asyncio.Protocol],
                 holders: Callable[[], dict[str, int]], say: Callable[[str, str], None]) -> None:
        self.socks = socks
        self.protocol = protocol
        self.holders = holders  # what holds descriptors, by kind (client and engine connections)
        self.say = say  # (kind, message): the door's notice, once per pause and once per resume
        self.loop = asyncio.get_running_loop()
        self.paused = False
        self.pauses = 0
        self.closed = False
        self._timer: asyncio.TimerHandle | None = None
        for s in socks:
            self.loop.add_reader(s.fileno(), self._accept, s)

    @property
    def port(self) -> int:
        return self.socks[0].getsockname()[1]

    def _accept(self, s: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_READ):
            try:
                conn, _ = s.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in OUT_OF_DESCRIPTORS:
                    self._pause(e.strerror or str(e))
                else:  # ECONNABORTED and friends: that client is gone, the next one may not be
                    log.debug("accept failed: %s", e)
                return
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.loop.create_task(self._connect(conn))
            if conn.fileno() >= resource.getrlimit(resource.RLIMIT_NOFILE)[0] - RESERVE:
                self._pause(f"descriptor {conn.fileno()} was the lowest free one")
                return

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.protocol, conn)
        except OSError:
            conn.close()

    def _pause(self, why: str) -> None:
        if self.paused or self.closed:
            return
        self.paused = True
        self.pauses += 1
        for s in self.socks:
            self.loop.remove_reader(s.fileno())
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        n = open_descriptors()
        held = self.holders()
        other = max(0, n - sum(held.values()))
        parts = ", ".join(f"{v} {k}" for k, v in held.items())
        self.say("door-fd-limit", f"the door stopped accepting connections: {n} of its {soft} file descriptors "
                 f"are open ({parts}, {other} other: client connections being set up, logs, locks, the door's own; {why}); it goes on "
                 f"serving the connections it has and accepts again once {RESUME_BELOW} are free. Raise the "
                 f"limit (ulimit -n, or LimitNOFILE= for a service; the hard limit is {hard}) or have clients "
                 "keep fewer idle connections")
        self._timer = self.loop.call_later(CHECK_S, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.closed:
            return
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        n = open_descriptors()
        if soft - n < RESUME_BELOW:
            self._timer = self.loop.call_later(CHECK_S, self._check)
            return
        self.paused = False
        for s in self.socks:
            self.loop.add_reader(s.fileno(), self._accept, s)
        self.say("door-fd-ok", f"the door accepts connections again: {n} of its {soft} file descriptors are open")

    def state(self) -> dict:
        """For /door/status: the limit the door runs with, what is open, and whether it accepts."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return {"limit": soft, "hard_limit": hard, "open": open_descriptors(), "accepting": not self.paused,
                "reserve": RESERVE, "pauses": self.pauses, **self.holders()}

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        for s in self.socks:
            if not self.paused:
                self.loop.remove_reader(s.fileno())
            s.close()
