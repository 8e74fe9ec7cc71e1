"""Why did an engine end? Match its log, its exit and the kernel's events against signatures.toml.

The catalogue is data: `classify` only ranks what matched. Each candidate carries the catalogue's
priority, and root causes outrank consequences wherever they are in the log: Xid 79 (the card fell off
the bus) beats the "CUDA error: unspecified launch failure" and EngineDeadError cascade it causes (seed
004's 09-12 crash), and a DeepGEMM panic beats the 30 EngineDeadError pairs printed after it (seed 000).
So the log given is the whole launch log (bounded by size, `deck/launch.py`'s `log_for_causes`), not
its last lines: a cascade fills any line count.

A kernel event is a cause only when it is this engine's: an Xid names the process that faulted and the
GPU it was on, and `Footprint` (the launch's processes and GPUs) says whether that is this launch. An
event of another process is kept in the record as "not this model's", never taken as the cause.
"""

from __future__ import annotations

import re
import signal as _signal
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

from servedeck.fsio import head_and_tail

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CATALOGUE = "signatures.toml"

# How much of a log a cause is looked for in. The root cause can be anywhere (seed 000: a DeepGEMM panic,
# then 30 EngineDeadError pairs, 91 lines), so the log is read whole; the bound is on bytes, not lines,
# because a cascade fills any line count while a long-serving engine's log grows without end. Past it, the
# first 2 MiB (the boot: versions, flags, start-up errors) and the last 14 MiB are read.
LOG_BYTES = 16 * 1024 * 1024
LOG_HEAD_BYTES = 2 * 1024 * 1024


def read_log(path: Path, max_bytes: int = LOG_BYTES, head_bytes: int = LOG_HEAD_BYTES) -> str:
    """An engine's log as `classify` reads it: whole up to `max_bytes`, else its head and tail with a line
    saying how much was left out between them; "" when there is no log."""
    return head_and_tail(Path(path), max_bytes, head_bytes)[0]


@dataclass(frozen=True)
class LogSignature:
    id: str
    family: str
    priority: int
    patterns: tuple[re.Pattern, ...]
    summary: str
    action: str
    engines: tuple[str, ...] = ()

    def first_match(self, lines: list[str]) -> str | None:
        for line in lines:
            if any(p.search(line) for p in self.patterns):
                return line.strip()
        return None

    def find(self, text: str) -> tuple[str, int] | None:
        """The first line of `text` any pattern matches, and its number (1-based). One search of the
        whole text per pattern (patterns are compiled per line: re.M), not one per line: a log of
        16 MiB is ~40 signatures × a few C-speed scans."""
        first = None
        for p in self.patterns:
            m = p.search(text)
            if m and (first is None or m.start() < first):
                first = m.start()
        if first is None:
            return None
        start = text.rfind("\n", 0, first) + 1
        end = text.find("\n", first)
        return text[start:end if end >= 0 else len(text)].strip(), text.count("\n", 0, start) + 1


@dataclass(frozen=True)
class Catalogue:
    schema: int
    logs: tuple[LogSignature, ...]
    kernel: tuple[LogSignature, ...]
    xids: dict[int, dict[str, Any]]
    exits: tuple[dict[str, Any], ...]
    user_text: tuple[tuple[tuple[str, ...], re.Pattern], ...] = ()  # (engines, lines echoing requests/answers)

    def without_user_text(self, log: str, kin: set[str]) -> str:
        """`log` with every line that echoes a request or an answer blanked (line numbers kept). The lines
        are found by their marker and cut by position: a `^.*marker.*$` regex backtracks on every line."""
        spans = []
        for engines, pattern in self.user_text:
            if not kin or not engines or kin & set(engines):
                for m in pattern.finditer(log):
                    end = log.find("\n", m.end())
                    spans.append((log.rfind("\n", 0, m.start()) + 1, end if end >= 0 else len(log)))
        if not spans:
            return log
        out, at = [], 0
        for start, end in sorted(spans):
            if start >= at:
                out.append(log[at:start])
                at = end
        return "".join(out) + log[at:]


def _sig(d: dict[str, Any]) -> LogSignature:
    return LogSignature(
        id=d["id"], family=d["family"], priority=int(d["priority"]),
        patterns=tuple(re.compile(p, re.M) for p in d["patterns"]),
        summary=d["summary"], action=d["action"], engines=tuple(d.get("engines", ())),
    )


def parse_catalogue(text: str) -> Catalogue:
    raw = tomllib.loads(text)
    return Catalogue(
        schema=int(raw.get("schema", 1)),
        logs=tuple(_sig(d) for d in raw.get("log", [])),
        kernel=tuple(_sig(d) for d in raw.get("kernel", [])),
        xids={int(d["code"]): d for d in raw.get("xid", [])},
        exits=tuple(raw.get("exit", [])),
        user_text=tuple((tuple(d.get("engines", ())), re.compile(p, re.M))
                        for d in raw.get("user_text", []) for p in d["patterns"]),
    )


@lru_cache(maxsize=4)
def load_catalogue(path: str | None = None) -> Catalogue:
    """The packaged catalogue (or one at `path`, for tests and local additions)."""
    text = Path(path).read_text() if path else resources.files("servedeck.doctor").joinpath(CATALOGUE).read_text()
    return parse_catalogue(text)


def xid_info(code: int, cat: Catalogue | None = None) -> dict[str, Any]:
    cat = cat or load_catalogue()
    known = cat.xids.get(code)
    if known:
        return known
    return {"code": code, "family": "xid-other", "severity": "unknown", "priority": 50,
            "meaning": f"Xid {code} (not in servedeck's catalogue)",
            "action": "look the code up in NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors)"}


def exit_signal(exit_info: Mapping[str, Any] | None) -> str | None:
    """SIGKILL etc. from {"signal": 9 | "SIGKILL"} or {"returncode": -9} (Popen's way of saying it)."""
    if not exit_info:
        return None
    sig = exit_info.get("signal")
    if isinstance(sig, str) and sig:
        return sig if sig.startswith("SIG") else f"SIG{sig.upper()}"
    rc = exit_info.get("returncode", exit_info.get("exit_code"))
    num = int(sig) if isinstance(sig, int) else (-int(rc) if isinstance(rc, int) and rc < 0 else None)
    if num is None and isinstance(rc, int) and rc - 128 in (6, 7, 9, 11, 15):
        num = rc - 128  # a shell wrapper reports a signal death as 128 + N
    if num is None:
        return None
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _event_dict(ev: Any) -> dict[str, Any]:
    return ev.to_json() if hasattr(ev, "to_json") else dict(ev)


_PCI = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?\s*$")


def pci_key(text: str | None) -> tuple[int, int, int] | None:
    """A GPU's PCI address as (domain, bus, device), however it is written: the kernel's Xid line says
    `PCI:0000:01:00`, NVML `00000000:01:00.0`. None when `text` names no address."""
    m = _PCI.search((text or "").replace("PCI:", ""))
    if not m:
        return None
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)


@dataclass(frozen=True)
class Footprint:
    """What one launch ran as, to tell its kernel events from other processes' (issue 31: an Xid 31
    of pid 4242 must not become the cause of another model's crash).

    pids: every pid the launch's process group had (the shim notes them while the engine runs, since
          they are gone when the crash is read); None when unknown, as for a container, whose processes
          are not in servedeck's group.
    gpus: the PCI bus ids of the launch's GPUs (NVML's, recorded at start); None when unknown (no NVML)."""

    pids: frozenset[int] | None = None
    gpus: tuple[str, ...] | None = None

    def owner(self, ev: Mapping[str, Any]) -> tuple[bool | None, str, str]:
        """(whether the event is this launch's, what decided it: pid | gpu | time, in words).
        An event naming a process is decided by that pid; one naming none (Xid 79: pid '<unknown>')
        by its GPU. Unknown on both counts: None, matched by time only, as before pids were kept."""
        pid = ev.get("pid")
        where = pci_key(ev.get("pci"))
        mine = {k for k in (pci_key(g) for g in self.gpus or ()) if k is not None}
        on_ours = (where in mine) if (where is not None and mine) else None
        gpu = f"GPU {ev.get('pci', '').replace('PCI:', '')}" if where is not None else "the GPU"
        if pid is not None and self.pids is not None:
            if pid in self.pids:
                return True, "pid", f"this model's: pid {pid} was one of its processes"
            who = f"pid {pid}" + (f" ({ev['process']})" if ev.get("process") else "")
            also = f", though on this model's {gpu}" if on_ours else ""
            return False, "pid", f"not this model's: {who} was another process{also}"
        if on_ours is not None:
            if on_ours:
                return True, "gpu", f"this model's: on its {gpu}" + (f" (pid {pid} not checked: "
                                                                    "the launch's pids are unknown)" if pid else "")
            return False, "gpu", f"not this model's: {gpu} is not one of its GPUs"
        return None, "time", "matched by time only: this launch's processes and GPUs are not known"


def lineage(engine: str) -> tuple[str, ...]:
    """The engine and those its adapter derives from (a vLLM fork: vLLM's signatures apply to it too)."""
    from servedeck.engines import all_engines

    adapter = all_engines().get(engine)
    return adapter.lineage if adapter is not None else (engine,)


def _kernel_candidates(ev: dict[str, Any], cat: Catalogue) -> list[dict[str, Any]]:
    if ev.get("kind") == "xid" and ev.get("code") is not None:
        info = xid_info(int(ev["code"]), cat)
        return [{"id": f"xid-{ev['code']}", "family": info["family"],
                 "summary": f"Xid {ev['code']}: {info['meaning']}", "action": info["action"],
                 "matched_line": ev.get("line", ""), "source": "kernel",
                 "priority": int(info["priority"]), "severity": info.get("severity")}]
    out = []
    for sig in cat.kernel:
        line = sig.first_match([ev.get("line", "")])
        if line is not None:
            out.append({"id": sig.id, "family": sig.family, "summary": sig.summary,
                        "action": sig.action, "matched_line": line, "source": "kernel",
                        "priority": sig.priority})
    return out


def classify(log: str, exit_info: Mapping[str, Any] | None, kernel_events: Iterable[Any],
             engine: str | None = None, catalogue: Catalogue | None = None,
             footprint: Footprint | None = None) -> dict[str, Any]:
    """The most likely cause of an engine's end, and everything else that matched.

    log: the launch's engine.log, whole (or its head and tail when it is very large: `log_for_causes`);
    exit_info: {"returncode": int, "signal": ...} or None; kernel_events: kernel.KernelEvent objects or
    their dicts (Xid and OOM-kill lines around the end); engine: the engine that wrote the log: signatures
    of other engines are not considered; footprint: the launch's pids and GPUs: a kernel event of another
    process or GPU is listed (`kernel`, `ours` false) but is no candidate. None: every event is one.
    Returns {id, family, summary, action, matched_line, line_no, source, priority, evidence, kernel, exit,
    log_lines}: `source` is "log", "kernel", "exit" or "none"; `evidence` lists every match, best first."""
    cat = catalogue or load_catalogue()
    kin = set(lineage(engine)) if engine else set()
    cands: list[dict[str, Any]] = []
    log = cat.without_user_text(log, kin)
    for sig in cat.logs:
        if kin and sig.engines and not kin & set(sig.engines):
            continue
        found = sig.find(log)
        if found is not None:
            cands.append({"id": sig.id, "family": sig.family, "summary": sig.summary, "action": sig.action,
                          "matched_line": found[0], "line_no": found[1], "source": "log",
                          "priority": sig.priority})
    events = [_event_dict(e) for e in kernel_events or ()]
    placed = []
    for ev in events:
        ours, by, whose = footprint.owner(ev) if footprint is not None else (None, "time", "matched by time only")
        placed.append({k: ev.get(k) for k in ("kind", "code", "at", "pci", "pid", "process", "text")}
                      | {"ours": ours, "matched_by": by, "whose": whose, "line": ev.get("line", "")})
        if ours is False:
            continue
        for c in _kernel_candidates(ev, cat):
            cands.append({**c, "whose": whose})
    sig_name = exit_signal(exit_info)
    rc = (exit_info or {}).get("returncode", (exit_info or {}).get("exit_code"))
    for ex in cat.exits:
        if ("signal" in ex and ex["signal"] == sig_name) or ("returncode" in ex and ex["returncode"] == rc):
            cands.append({"id": ex["id"], "family": ex["family"], "summary": ex["summary"], "action": ex["action"],
                          "matched_line": f"exit: {sig_name or f'code {rc}'}", "source": "exit",
                          "priority": int(ex["priority"])})
    # dedupe (an Xid repeated per GPU counts once as a candidate), best first; ties keep log before kernel
    seen: set[str] = set()
    ranked = []
    for c in sorted(cands, key=lambda c: -c["priority"]):
        if c["id"] not in seen:
            seen.add(c["id"])
            ranked.append(c)
    lines = log.count("\n") + (1 if log and not log.endswith("\n") else 0)
    base = {"evidence": ranked[1:], "kernel": [p for p in placed if p["kind"] == "xid"],
            "kernel_other": [p for p in placed if p["kind"] != "xid"],
            "exit": dict(exit_info) if exit_info else None, "catalogue_schema": cat.schema, "log_lines": lines}
    if ranked:
        return {**ranked[0], **base}
    how = f"ended by {sig_name}" if sig_name else (f"exited with code {rc}" if rc is not None else "ended")
    theirs = [p for p in placed if p["ours"] is False]
    kernel = f"no kernel event of this model's ({len(theirs)} of other processes)" if theirs else "no kernel event"
    return {"id": "unknown", "family": "unknown", "source": "none", "priority": 0, "matched_line": "",
            "summary": f"{how}; no known signature in its whole log ({lines:,} line{'s' if lines != 1 else ''}) "
                       f"and {kernel}",
            "action": "read the whole log (`servedeck logs MODEL`); add the signature to doctor/signatures.toml "
                      "once the cause is known", **base}
