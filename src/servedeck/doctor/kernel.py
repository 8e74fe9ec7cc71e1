"""GPU events from the kernel log: NVRM Xid lines (and OOM-killer lines), over every boot the journal keeps.

Only `NVRM: Xid (` counts, case-sensitively: the r8169 NIC driver prints "XID 541" / "XID 64a" in its
banner and is not a GPU event (seed 004). The kernel log is read through the journal first, over all
boots (seed 004's lesson, `journalctl -k -b all`: an Xid 79 ends in a reboot, so the crash is in an
earlier boot), and each event says which boot it is from: the journal's boot id and its index as
`journalctl --list-boots` numbers them (0 = this boot, -1 the one before, ...). The journal is read as
JSON because that output carries each line's `_BOOT_ID`; the text formats only mark boot changes.
Without a persistent journal, `dmesg` gives the current boot only, and the source says so; when nothing
is readable the result says why, and the doctor shows SKIP rather than a clean OK.
"""

from __future__ import annotations

import json
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
    boot_id: str | None = None  # the journal's boot id (32 hex digits)
    boot: int | None = None  # as `journalctl --list-boots` numbers it: 0 this boot, -1 the one before, ...

    @property
    def boot_label(self) -> str:
        if self.boot is None:
            return f"boot {self.boot_id[:8]}" if self.boot_id else "boot unknown"
        return "this boot" if self.boot == 0 else f"boot {self.boot}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class KernelLog:
    readable: bool
    source: str  # the command that was read, or what was tried
    reason: str | None = None  # why it could not be read
    lines_read: int = 0
    events: list[KernelEvent] = field(default_factory=list)

    boots_read: int = 0  # how many boots the source covered (1 for dmesg)

    @property
    def xids(self) -> list[KernelEvent]:
        return [e for e in self.events if e.kind == "xid"]

    def to_json(self) -> dict[str, Any]:
        return {"readable": self.readable, "source": self.source, "reason": self.reason,
                "lines_read": self.lines_read, "boots_read": self.boots_read,
                "events": [e.to_json() for e in self.events]}


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


LIST_BOOT = re.compile(r"^\s*(?P<idx>-?\d+)\s+(?P<id>[0-9a-f]{32})\s", re.M)


def parse_list_boots(text: str) -> dict[str, int]:
    """Pure: `journalctl --list-boots` text → boot id → index (0 = this boot)."""
    return {m.group("id"): int(m.group("idx")) for m in LIST_BOOT.finditer(text)}


def parse_journal_json(text: str, boot_index: dict[str, int] | None = None,
                       catalogue: Catalogue | None = None) -> tuple[list[KernelEvent], int, int]:
    """Pure: `journalctl -o json` kernel lines (any number of boots) → (events, lines, boots seen).

    Each event carries its line's `_BOOT_ID` and, where `boot_index` knows it, the boot's index."""
    cat = catalogue or load_catalogue()
    events: list[KernelEvent] = []
    boots: set[str] = set()
    n = 0
    for raw in text.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        n += 1
        msg = entry.get("MESSAGE") or ""
        if isinstance(msg, list):  # journald gives non-UTF-8 messages as a byte array
            msg = bytes(msg).decode("utf-8", "replace")
        boot_id = entry.get("_BOOT_ID")
        if boot_id:
            boots.add(boot_id)
        try:
            at = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
            stamp = datetime.fromtimestamp(at).astimezone().isoformat(timespec="microseconds")
        except (KeyError, ValueError, TypeError):
            at, stamp = None, ""
        for ev in parse_kernel_lines(f"{stamp} kernel: {msg}".strip(), None, cat):
            ev.at = at
            ev.boot_id = boot_id
            ev.boot = (boot_index or {}).get(boot_id) if boot_id else None
            events.append(ev)
    return events, n, len(boots)


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _journal_ok(cp: "subprocess.CompletedProcess[str]") -> bool:
    # journalctl exits 0 and prints "-- No entries --" when it has no journal files at all (containers)
    out = cp.stdout.strip()
    return cp.returncode == 0 and bool(out) and out != "-- No entries --"


def _current_boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "")
    except OSError:
        return None


def _boot_index(run: Runner) -> dict[str, int]:
    try:
        cp = run(["journalctl", "--no-pager", "--list-boots"])
    except (FileNotFoundError, subprocess.TimeoutExpired, OSError):
        return {}
    return parse_list_boots(cp.stdout) if cp.returncode == 0 else {}


def read_kernel_events(boots: str = "all", since: float | None = None, until: float | None = None,
                       run: Runner = _run) -> KernelLog:
    """Xid / OOM events from the kernel log, each with the boot it is from. boots="all" (the default)
    reads every boot the journal keeps; "current" only this one. Without a journal, dmesg gives the
    current boot and the source says so. since/until (epoch) keep only events inside a window (for a
    crash's end time); lines without a readable timestamp are kept, as they cannot be placed."""
    tried = []
    j = ["journalctl", "--no-pager", "-o", "json", "--output-fields=MESSAGE,_BOOT_ID", "_TRANSPORT=kernel"]
    if boots == "current":
        j.append("-b")
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
        if argv[0] == "journalctl":
            events, lines, nboots = parse_journal_json(cp.stdout, _boot_index(run))
            src = "journalctl -k " + ("-b (this boot)" if boots == "current" else "(all boots)")
        else:
            events = parse_kernel_lines(cp.stdout, psutil.boot_time())
            lines, nboots = len(cp.stdout.splitlines()), 1
            current = _current_boot_id()
            for e in events:
                e.boot, e.boot_id = 0, current
            src = " ".join(argv) + (" (current boot only: no journal for earlier boots)" if boots != "current" else "")
            if tried:
                src += f"; {tried[0]}"
        if since is not None or until is not None:
            events = [e for e in events if e.at is None or
                      ((since is None or e.at >= since) and (until is None or e.at <= until))]
        return KernelLog(True, src, None, lines, events, boots_read=nboots)
    return KernelLog(False, "journalctl -k (all boots), dmesg", "; ".join(tried) or "no kernel log reader")


def events_near(when: float, before_s: float = 600.0, after_s: float = 120.0, run: Runner = _run) -> list[KernelEvent]:
    """Kernel events around an engine's end time (all boots: an Xid 79 is followed by a reboot), for
    `forensics.classify`. Empty when the kernel log is unreadable (the crash record then has no Xid
    evidence, which `classify` reports as "no kernel event", not as proof of none)."""
    log = read_kernel_events(boots="all", since=when - before_s, until=when + after_s, run=run)
    return log.events if log.readable else []
