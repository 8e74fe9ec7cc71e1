"""This host's CPUs and NUMA nodes, as /sys/devices/system/node describes them."""

from __future__ import annotations

import os
from pathlib import Path

NODE_DIR = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` → [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def cpulist_text(numbers: list[int]) -> str:
    """[0, 1, 2, 3, 96, 97] → "0-3,96-97": runs in the order given, as the seed writes --cpuset-cpus."""
    out: list[str] = []
    start = prev = None
    for n in numbers:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


def nodes_of(cpus: list[int], topology: dict[int, list[int]]) -> list[int]:
    """The nodes of `topology` (node → its CPUs) that hold any of `cpus`, sorted."""
    return sorted(n for n, cs in topology.items() if set(cs) & set(cpus))


def numa_nodes(root: Path = NODE_DIR) -> dict[int, list[int]]:
    """NUMA node → its CPUs; {} where the kernel exposes no node directory."""
    out: dict[int, list[int]] = {}
    if not root.exists():
        return out
    for d in sorted(root.glob("node[0-9]*")):
        try:
            out[int(d.name[4:])] = parse_cpulist((d / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return out


def numa_nodes_of(cpus: list[int], root: Path = NODE_DIR) -> list[int]:
    """The NUMA nodes those CPUs belong to, sorted."""
    return nodes_of(cpus, numa_nodes(root))


def usable_cpus() -> set[int]:
    """CPUs this process may run on (its affinity), which a pinned engine must stay within."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))
