"""GPU events from the kernel log: NVRM Xid lines (and OOM-killer lines), read since boot when readable.

Only `NVRM: Xid (` counts, case-sensitively: the r8169 NIC driver prints "XID 541" / "XID 64a" in its
banner and is not a GPU event (seed 004). The kernel log is tried through `journalctl -k` first (it keeps
earlier boots, which matter: an Xid 79 ends in a reboot) and `dmesg` second; when neither is readable the
result says so, and the doctor shows SKIP with that reason rather than a clean OK.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable

import psutil

from servedeck.doctor.forensics import Catalogue, load_catalogue, xid_info

XID = re.compile(
    r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<code>\d+)"
    r"(?:, pid=(?P<pid>'?[^,']*'?))?(?:, name=(?P<name>[^,]*))?(?:, (?P<text>.*))?"
)
OOM = re.compile(r"Out of memory: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)|oom-kill:.*task=(?P<task>[^,]+)")
ISO = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?)")
MONO = re.compile(r"^\[\s*(?P<s>\d+\.\d+)\]")


@dataclass
class KernelEvent:
    kind: str  # "xid" | "oom-kill"
    line: str
    at: float | None = None  # epoch seconds, when the line's timestamp could be read
    code: int | None = None
    pci: str | None = None
    pid: int | None = None
    process: str | None = None
    text: str = ""
    family: str = ""
    severity: str = ""
    meaning: str = ""
    action: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class KernelLog:
    readable: bool
    source: str  # the command that was read, or what was tried
    reason: str | None = None  # why it could not be read
    lines_read: int = 0
    events: list[KernelEvent] = field(default_factory=list)

    @property
    def xids(self) -> list[KernelEvent]:
        return [e for e in self.events if e.kind == "xid"]

    def to_json(self) -> dict[str, Any]:
        return {"readable": self.readable, "source": self.source, "reason": self.reason,
                "lines_read": self.lines_read, "events": [e.to_json() for e in self.events]}


def _timestamp(line: str, boot_time: float | None) -> float | None:
    m = ISO.match(line)
    if m:
        ts = m.group("ts").replace(",", ".")
        ts = re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", ts).replace("Z", "+00:00")
        try:
            return datetime.fromisoformat(ts).timestamp()
        except ValueError:
            return None
    m = MONO.match(line)
    if m and boot_time is not None:  # plain dmesg: seconds since boot
        return boot_time + float(m.group("s"))
    return None


def _pid(v: str | None) -> int | None:
    v = (v or "").strip("'")
    return int(v) if v.isdigit() else None


def parse_kernel_lines(text: str, boot_time: float | None = None, catalogue: Catalogue | None = None) -> list[KernelEvent]:
    """Pure: every Xid and OOM-kill line of a kernel log dump, classified from the catalogue."""
    cat = catalogue or load_catalogue()
    events = []
    for line in text.splitlines():
        m = XID.search(line)
        if m:
            code = int(m.group("code"))
            info = xid_info(code, cat)
            events.append(KernelEvent(
                kind="xid", line=line.strip(), at=_timestamp(line, boot_time), code=code, pci=m.group("pci"),
                pid=_pid(m.group("pid")), process=(m.group("name") or "").strip() or None,
                text=(m.group("text") or "").strip(), family=info["family"], severity=info.get("severity", ""),
                meaning=info["meaning"], action=info["action"]))
            continue
        m = OOM.search(line)
        if m:
            events.append(KernelEvent(
                kind="oom-kill", line=line.strip(), at=_timestamp(line, boot_time), pid=_pid(m.group("pid")),
                process=m.group("name") or m.group("task"), family="host-oom", severity="app",
                meaning="the kernel's OOM killer ended a process", action="see host RAM use; set host_ram_gib"))
    return events


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _journal_ok(cp: "subprocess.CompletedProcess[str]") -> bool:
    # journalctl exits 0 and prints "-- No entries --" when it has no journal files at all (containers)
    out = cp.stdout.strip()
    return cp.returncode == 0 and bool(out) and out != "-- No entries --"


def read_kernel_events(boots: str = "current", since: float | None = None, until: float | None = None,
                       run: Runner = _run) -> KernelLog:
    """Xid / OOM events from the kernel log. boots="all" reads earlier boots too (journalctl only).
    since/until (epoch) keep only events inside a window (for a crash's end time); lines without a
    readable timestamp are kept, as they cannot be placed."""
    tried = []
    j = ["journalctl", "--no-pager", "-o", "short-iso-precise", "-k"] + (["-b"] if boots == "current" else [])
    if boots != "current":
        j = ["journalctl", "--no-pager", "-o", "short-iso-precise", "_TRANSPORT=kernel"]
    # a window narrows the journal read itself (all boots of a long-lived host are a lot of lines)
    if since is not None:
        j.append(f"--since=@{int(since)}")
    if until is not None:
        j.append(f"--until=@{int(until) + 1}")
    attempts: list[list[str]] = [j, ["dmesg", "--time-format", "iso"], ["dmesg"]]
    for argv in attempts:
        try:
            cp = run(argv)
        except FileNotFoundError:
            tried.append(f"{argv[0]}: not installed")
            continue
        except (subprocess.TimeoutExpired, OSError) as e:
            tried.append(f"{argv[0]}: {e}")
            continue
        ok = _journal_ok(cp) if argv[0] == "journalctl" else (cp.returncode == 0 and bool(cp.stdout.strip()))
        if not ok:
            why = (cp.stderr.strip() or cp.stdout.strip() or f"exit {cp.returncode}").splitlines()[0]
            tried.append(f"{' '.join(argv[:2])}: {why}")
            continue
        boot = psutil.boot_time()
        events = parse_kernel_lines(cp.stdout, boot)
        if since is not None or until is not None:
            events = [e for e in events if e.at is None or
                      ((since is None or e.at >= since) and (until is None or e.at <= until))]
        src = " ".join(argv)
        if argv[0] == "dmesg" and boots != "current":
            src += " (current boot only: no journal for earlier boots)"
        return KernelLog(True, src, None, len(cp.stdout.splitlines()), events)
    return KernelLog(False, "journalctl -k, dmesg", "; ".join(tried) or "no kernel log reader")


def events_near(when: float, before_s: float = 600.0, after_s: float = 120.0, run: Runner = _run) -> list[KernelEvent]:
    """Kernel events around an engine's end time (all boots: an Xid 79 is followed by a reboot), for
    `forensics.classify`. Empty when the kernel log is unreadable (the crash record then has no Xid
    evidence, which `classify` reports as "no kernel event", not as proof of none)."""
    log = read_kernel_events(boots="all", since=when - before_s, until=when + after_s, run=run)
    return log.events if log.readable else []
