"""Why did an engine end? Match its log tail, its exit and the kernel's events against signatures.toml.

The catalogue is data: `classify` only ranks what matched. Each candidate carries the catalogue's
priority, and root causes outrank consequences: Xid 79 (the card fell off the bus) beats the
"CUDA error: unspecified launch failure" and EngineDeadError cascade it causes (seed 004's 09-12 crash),
and an illegal memory access beats the EngineDeadError that follows it.
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

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CATALOGUE = "signatures.toml"


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


@dataclass(frozen=True)
class Catalogue:
    schema: int
    logs: tuple[LogSignature, ...]
    kernel: tuple[LogSignature, ...]
    xids: dict[int, dict[str, Any]]
    exits: tuple[dict[str, Any], ...]


def _sig(d: dict[str, Any]) -> LogSignature:
    return LogSignature(
        id=d["id"], family=d["family"], priority=int(d["priority"]),
        patterns=tuple(re.compile(p) for p in d["patterns"]),
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


def lineage(engine: str) -> tuple[str, ...]:
    """The engine and those its adapter derives from (a vLLM fork: vLLM's signatures apply to it too)."""
    from servedeck.engines import all_engines

    adapter = all_engines().get(engine)
    return adapter.lineage if adapter is not None else (engine,)


def classify(log_tail: str, exit_info: Mapping[str, Any] | None, kernel_events: Iterable[Any],
             engine: str | None = None, catalogue: Catalogue | None = None) -> dict[str, Any]:
    """The most likely cause of an engine's end, and everything else that matched.

    log_tail: the last lines of engine.log; exit_info: {"returncode": int, "signal": ...} or None;
    kernel_events: kernel.KernelEvent objects or their dicts (Xid and OOM-kill lines around the end);
    engine: the engine that wrote the log: signatures of other engines are not considered.
    Returns {id, family, summary, action, matched_line, source, priority, evidence, kernel, exit}:
    `source` is "log", "kernel", "exit" or "none"; `evidence` lists every match, best first."""
    cat = catalogue or load_catalogue()
    lines = log_tail.splitlines()
    kin = set(lineage(engine)) if engine else set()
    cands: list[dict[str, Any]] = []
    for sig in cat.logs:
        if kin and sig.engines and not kin & set(sig.engines):
            continue
        line = sig.first_match(lines)
        if line is not None:
            cands.append({"id": sig.id, "family": sig.family, "summary": sig.summary, "action": sig.action,
                          "matched_line": line, "source": "log", "priority": sig.priority})
    events = [_event_dict(e) for e in kernel_events or ()]
    for ev in events:
        if ev.get("kind") == "xid" and ev.get("code") is not None:
            info = xid_info(int(ev["code"]), cat)
            cands.append({"id": f"xid-{ev['code']}", "family": info["family"],
                          "summary": f"Xid {ev['code']}: {info['meaning']}", "action": info["action"],
                          "matched_line": ev.get("line", ""), "source": "kernel",
                          "priority": int(info["priority"]), "severity": info.get("severity")})
        else:
            for sig in cat.kernel:
                line = sig.first_match([ev.get("line", "")])
                if line is not None:
                    cands.append({"id": sig.id, "family": sig.family, "summary": sig.summary,
                                  "action": sig.action, "matched_line": line, "source": "kernel",
                                  "priority": sig.priority})
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
    xids = [{k: ev.get(k) for k in ("code", "at", "pci", "pid", "process", "text")}
            for ev in events if ev.get("kind") == "xid"]
    base = {"evidence": ranked[1:], "kernel": xids, "exit": dict(exit_info) if exit_info else None,
            "catalogue_schema": cat.schema}
    if ranked:
        return {**ranked[0], **base}
    how = f"ended by {sig_name}" if sig_name else (f"exited with code {rc}" if rc is not None else "ended")
    return {"id": "unknown", "family": "unknown", "source": "none", "priority": 0, "matched_line": "",
            "summary": f"{how}; no known signature in the last {len(lines)} log lines and no kernel event",
            "action": "read the whole log (`servedeck logs MODEL`); add the signature to doctor/signatures.toml "
                      "once the cause is known", **base}
