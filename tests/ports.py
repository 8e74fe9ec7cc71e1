"""Free loopback ports for tests that start servers.

Picked below the kernel's ephemeral range (net.ipv4.ip_local_port_range), never by binding port 0: a
port from that range, free when asked, can become the source port of any outgoing connection before
the engine binds it (the door and the load generator open many), and the engine then fails to start.
Outside the range only another server can take it, and the bind check below sees those.

Under pytest-xdist each worker picks from its own share of that span: two workers can pick the same free
port for models.toml files whose engines have not bound it yet, and the second engine then fails to start."""

from __future__ import annotations

import os
import random
import socket

from workers import worker_index


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _span(low: int) -> tuple[int, int]:
    """This process's share of [10000, low - 1): all of it, or worker gwN's Nth of PYTEST_XDIST_WORKER_COUNT."""
    n, count = worker_index(os.environ), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if n is None or not count.isdigit() or int(count) < 2:
        return 10000, low - 1
    width = (low - 1 - 10000) // int(count)
    start = 10000 + width * (n % int(count))
    return start, start + width


_given: set[int] = set()  # never the same port twice in one process: a models.toml asks for several before any is bound


def free_port() -> int:
    low = _ephemeral_low()
    if low > 12000:
        start, end = _span(low)
        for _ in range(200):
            p = random.randrange(start, end - 1)  # end - 1: free_port_pair may take p + 1
            if p not in _given and _bindable(p):
                _given.add(p)
                return p
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port p with p + 1 free as well (a models.toml entry with replicas = 2 serves on both)."""
    for _ in range(50):
        p = free_port()
        if p + 1 not in _given and _bindable(p + 1):
            _given.add(p + 1)
            return p
    raise RuntimeError("no two consecutive free ports found")


def starter_toml() -> str:
    """`servedeck init`'s starter models.toml with each model's port moved to a free one."""
    from servedeck.init import render_starter

    text = render_starter()
    for old in ("8081", "8091", "8082", "8092"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    return text
