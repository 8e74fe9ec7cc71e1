"""Whether a figure still holds: what it was measured with beside what would be launched today. Pure.

A figure is **stale** when the build it ran on, the engine version, the rendered launch (flags and
environment, secrets redacted, the address it listened on left out: a port does not change what is
measured) or the configured context differ from today's. A fact the old record does not hold (a
launch written before servedeck recorded engine versions) is not called stale: it is said to be
unknown, since nothing shows it changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from servedeck.report.knobs import address_flags, changed, flags_of, redact

ABSENT = "(absent)"


@dataclass(frozen=True)
class Basis:
    """What one figure was measured with, or what a launch would be made with today."""

    build: Optional[str] = None
    build_path: Optional[str] = None
    engine_version: Optional[str] = None
    flags: Optional[dict[str, str]] = None  # the rendered flags (flags_of), address flags left out
    env: Optional[dict[str, str]] = None
    context: Optional[int] = None
    unknown: tuple[str, ...] = field(default=())  # what the record does not say

    def to_json(self) -> dict[str, Any]:
        return {"build": self.build, "build_path": self.build_path, "engine_version": self.engine_version,
                "context": self.context}


def launch_flags(argv: Optional[list[str]], engine: str) -> Optional[dict[str, str]]:
    """argv → {flag: value} as `compare` reads it (report/knobs.py), without the executable (the build
    says that) and without the flags that only say where the server listens."""
    if not argv:
        return None
    where = address_flags(engine)
    return {k: v for k, v in flags_of(argv).items() if k != "executable" and k not in where}


def redacted_env(env: Optional[dict[str, Any]]) -> Optional[dict[str, str]]:
    if env is None:
        return None
    return {k: redact(k, str(v)) for k, v in sorted(env.items())}


def basis(*, build: Optional[str], build_path: Optional[str], engine_version: Optional[str],
          argv: Optional[list[str]], env: Optional[dict[str, Any]], context: Optional[int], engine: str) -> Basis:
    flags = launch_flags(argv, engine)
    missing = tuple(k for k, v in (("build", build), ("engine version", engine_version),
                                   ("launch argv", flags)) if v is None)
    return Basis(build, build_path, engine_version, flags, redacted_env(env), context, missing)


def _reason(what: str, then: Any, now: Any, detail: Optional[list[str]] = None) -> dict[str, Any]:
    """One reason, always the same four keys: `changes` lists a launch's differences flag by flag (then and
    now are None for those), and is None for a value that changed as a whole."""
    return {"what": what, "then": then, "now": now, "changes": detail or None}


def stale_reasons(then: Basis, now: Basis, *, launch: bool = True) -> list[dict[str, Any]]:
    """What changed between `then` (a figure's basis) and `now` (today's), each {what, then, now[, changes]}.
    `launch=False` leaves the rendered launch out (a campaign variant's flags differ from the model's
    by design; only its build, engine version and context can go stale)."""
    out = []
    if then.build and now.build and then.build != now.build:
        out.append(_reason("build", then.build, now.build))
    elif then.build_path and now.build_path and then.build_path != now.build_path:
        out.append(_reason("build path", then.build_path, now.build_path))
    if then.engine_version and now.engine_version and then.engine_version != now.engine_version:
        out.append(_reason("engine version", then.engine_version, now.engine_version))
    if then.context and now.context and then.context != now.context:
        out.append(_reason("context", then.context, now.context))
    if launch and then.flags is not None and now.flags is not None:
        diff = changed(then.flags, now.flags)
        if diff:
            out.append(_reason("rendered argv", None, None, [f"{n}: {a} → {b}" for n, a, b in diff]))
    if launch and then.env is not None and now.env is not None:
        diff = changed(then.env, now.env)
        if diff:
            out.append(_reason("environment", None, None, [f"{n}: {a} → {b}" for n, a, b in diff]))
    return out


def mark(then: Basis, now: Basis, *, launch: bool = True) -> dict[str, Any]:
    """The stale mark a figure carries on the page: {stale, why: [...], unknown: [...]}."""
    why = stale_reasons(then, now, launch=launch)
    return {"stale": bool(why), "why": why, "unknown": list(then.unknown)}


def why_text(m: dict[str, Any]) -> str:
    """The mark in words: "stale: engine version b1 → b2; rendered argv (--threads: 2 → 1)"."""
    if not m.get("stale"):
        return ""
    parts = []
    for r in m.get("why") or []:
        if r.get("changes"):
            parts.append(f"{r['what']} ({'; '.join(r['changes'])})")
        else:
            parts.append(f"{r['what']} {r['then']} → {r['now']}")
    return "stale: " + "; ".join(parts)
