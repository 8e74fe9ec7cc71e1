"""Acknowledged kernel events: `servedeck doctor --ack-kernel` and what the kernel row makes of it.

The kernel row FAILs on a device- or node-level Xid in any boot the journal keeps, which is right the
day it happens and wrong for ever after: seed 004's two Xid 79 (September, the host's power path, not an
engine) would fail every doctor run until the journal rotates. A user who has read them acknowledges
them: the acknowledgement is recorded, with who and when, in $SERVEDECK_HOME/kernel-acks.json (written
atomically; earlier acknowledgements are kept). From then on those events are still shown, marked as
acknowledged, but do not fail the row; an event after them fails it again.

What an acknowledgement covers: every event up to the latest one it saw (`through`, epoch seconds), and
events that carry no readable time by their line. Time rather than a line's text, because the same event
reads differently through the journal and through dmesg (the fallback when the journal is gone).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

from servedeck import paths
from servedeck.errors import StateError
from servedeck.fsio import atomic_write_json

SCHEMA = 1


def acks_file():
    return paths.home() / "kernel-acks.json"


def read_acks() -> list[dict[str, Any]]:
    """Every acknowledgement made under this SERVEDECK_HOME, oldest first ([] when none)."""
    try:
        doc = json.loads(acks_file().read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        raise StateError(f"{acks_file()} is not readable JSON",
                         hint="fix or remove it (then acknowledge again with `servedeck doctor --ack-kernel`)") from None
    return [a for a in doc.get("acks", []) if isinstance(a, dict)] if isinstance(doc, dict) else []


def who() -> str:
    """The person acknowledging: the login behind sudo when there is one, and the host."""
    user = os.environ.get("SUDO_USER")
    try:
        me = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        me = f"uid {os.getuid()}"
    return f"{user} (as {me} via sudo)@{socket.gethostname()}" if user and user != me else f"{me}@{socket.gethostname()}"


def describe(events: Iterable[Any]) -> str:
    """`Xid 79 ×2, Xid 154 ×2, OOM killer ×1`."""
    n = Counter(f"Xid {e.code}" if e.kind == "xid" else "OOM killer" for e in events)
    return ", ".join(f"{k} ×{v}" for k, v in sorted(n.items()))


def acknowledge(events: list[Any], by: str | None = None, now: float | None = None) -> dict[str, Any]:
    """Record that `events` (kernel.KernelEvent) were seen and need not fail the kernel row again.
    Returns the acknowledgement written."""
    now = time.time() if now is None else now
    timed = [e.at for e in events if e.at is not None]
    ack = {"acknowledged_at": datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"), "t": now,
           "by": by or who(), "events": len(events), "what": describe(events),
           "through": max(timed) if timed else None,
           "through_at": datetime.fromtimestamp(max(timed)).astimezone().isoformat(timespec="seconds") if timed else None,
           "untimed_lines": sorted({e.line for e in events if e.at is None})}
    atomic_write_json(acks_file(), {"schema": SCHEMA, "acks": [*read_acks(), ack]})
    return ack


@dataclass
class Split:
    """A kernel log's events: those acknowledged (and the acknowledgement that covers the newest of them)
    and the new ones, which the row judges."""

    acked: list[Any]
    new: list[Any]
    last_ack: dict[str, Any] | None


def split(events: list[Any], acks: list[dict[str, Any]]) -> Split:
    through = max((a["through"] for a in acks if a.get("through") is not None), default=None)
    lines = {ln for a in acks for ln in a.get("untimed_lines") or ()}
    acked, new = [], []
    for e in events:
        covered = (e.at is not None and through is not None and e.at <= through) or (e.at is None and e.line in lines)
        (acked if covered else new).append(e)
    return Split(acked, new, acks[-1] if acks and acked else None)
