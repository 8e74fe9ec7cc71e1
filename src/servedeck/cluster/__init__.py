"""Campaigns across hosts, on Ray (`servedeck campaign run FILE --ray ADDRESS`, `servedeck hosts`).

servedeck grows no cluster manager of its own: each campaign cell becomes one Ray task that asks for
the cell's GPUs and CPUs (and its variant's `host`), and runs servedeck's own cell code on the node
that got them: deck launch, gate, workloads, stop, exactly as `campaign run` does on one host. The
run folders travel back to the head's results dir through Ray as they are written, unless the node's
results dir is the head's (one host, a shared filesystem): then they are written there once. The
campaign folder is the head's alone.

    connect.py   --ray auto | local | ADDRESS (or SERVEDECK_RAY_ADDRESS) → a connected driver
    node.py      what runs on a node: one cell (a streaming generator of files and phases), node facts
    dispatch.py  the head: RayPlacement, the campaign runner's placement: preflight on every node, one
                 task per cell, node-loss retries, Ctrl-C
    hosts.py     `servedeck hosts`: each node's host, GPUs, CPUs, servedeck version, doctor verdict

Ray is the optional extra `servedeck[ray]`; nothing else in servedeck imports it.
"""

from __future__ import annotations

from typing import Any

from servedeck.errors import ServedeckError


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ServedeckError("--ray needs Ray, which is not installed here",
                             hint="pip install 'servedeck[ray]' (on the head and on every node)") from None
    return ray
