"""Free loopback ports for the servers that tests, bench scripts and the demo start.

Picked below the kernel's ephemeral range (net.ipv4.ip_local_port_range), never by binding port 0: a port
from that range, free when asked, can become the source port of any outgoing connection before the server
binds it (the door, the load generator and every test client open many), and the server then fails to
start. Outside the range only another server can take it, and the bind check here sees those. Tests moved
off port 0 in issue 20; the bench scripts (which tests run too) and the demo kept their own copies of it
until 2026-12-06.

Under pytest-xdist each worker picks from its own share of that span: two workers can pick the same free
port for models.toml files whose engines have not bound it yet, and the second engine then fails to start.
A bench script a test runs inherits the worker's PYTEST_XDIST_WORKER, so it keeps to the same share.
"""

from __future__ import annotations

import os
import random
import socket
from typing import Mapping, Optional

FLOOR = 10000  # below this, the well-known and registered services people run on their own machines


def worker_index(env: Mapping[str, str]) -> Optional[int]:
    """N for pytest-xdist's worker gwN (its PYTEST_XDIST_WORKER), None in a one-process run."""
    worker = env.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else None


def ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def span(low: int, env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """This process's share of [FLOOR, low - 1): all of it, or worker gwN's Nth of PYTEST_XDIST_WORKER_COUNT."""
    n, count = worker_index(env), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if n is None or not count.isdigit() or int(count) < 2:
        return FLOOR, low - 1
    width = (low - 1 - FLOOR) // int(count)
    start = FLOOR + width * (n % int(count))
    return start, start + width


given: set[int] = set()  # never the same port twice in one process: a models.toml asks for several before any is bound


def free_port() -> int:
    low = ephemeral_low()
    if low > FLOOR + 2000:
        start, end = span(low)
        for _ in range(200):
            p = random.randrange(start, end - 1)  # end - 1: free_port_pair may take p + 1
            if p not in given and bindable(p):
                given.add(p)
                return p
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port p with p + 1 free as well (a models.toml entry with replicas = 2 serves on both)."""
    for _ in range(50):
        p = free_port()
        if p + 1 not in given and bindable(p + 1):
            given.add(p + 1)
            return p
    raise RuntimeError("no two consecutive free ports found")
