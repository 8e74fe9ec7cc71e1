"""A launch folder: the exact command, the engine's output, its boot facts, and how it ended.

    launches/<model>/<YYYYmmdd-HHMMSS>/
        cmd.sh       the launch, shell-quoted, secrets redacted (readable, re-runnable once secrets are set)
        engine.log   everything the engine printed
        launch.json  servedeck's record: spec, state, readiness, end and classified cause
        boot.json    facts parsed from the boot log (KV tokens, load times, slots, ...)
        engine.json  the engine's own pid (written by the shim)
        pids.json    every pid the engine's process group had (written by the shim as they appear): a
                     kernel Xid names the process that faulted, and after a crash they are gone
        exit.json    how the engine ended: return code or signal (written by the shim)
"""

from __future__ import annotations

import json
import os
import shlex
from datetime import datetime
from pathlib import Path

from servedeck import __version__, paths
from servedeck.deck.state import now_iso
from servedeck.engines.base import LaunchSpec
from servedeck.doctor.forensics import read_log
from servedeck.fsio import atomic_write_json, atomic_write_text, tail_text


def new_launch_dir(model: str) -> Path:
    base = paths.launches_dir() / paths.component(model)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    d = base / stamp
    n = 1
    while d.exists():
        n += 1
        d = base / f"{stamp}-{n}"
    d.mkdir(parents=True)
    return d


def cmd_sh(spec: LaunchSpec, build_name: str, config_path: str) -> str:
    lines = [
        "#!/bin/sh",
        f"# servedeck {__version__}: launch of {spec.model} ({spec.engine}, build {build_name}) at {now_iso()}",
        f"# from {config_path}; secret values are redacted: set them in your environment before re-running",
    ]
    lines += env_lines(spec)
    lines.append("exec " + " \\\n  ".join(shell_lines(spec.redacted_argv())))
    return "\n".join(lines) + "\n"


def env_lines(spec: LaunchSpec) -> list[str]:
    """The launch's environment as shell lines: exported, and a secret demanded from the caller's own."""
    return [f": \"${{{key}:?set {key} first}}\"" if value == "<redacted>" else f"export {key}={shlex.quote(value)}"
            for key, value in spec.redacted_env().items()]


def shell_lines(argv: list[str]) -> list[str]:
    """One flag and its value per line, as a person would write it."""
    out: list[str] = []
    for a in argv:
        q = shlex.quote(a)
        if out and not a.startswith("-") and out[-1].startswith("-") and " " not in out[-1]:
            out[-1] += " " + q
        else:
            out.append(q)
    return out


def write_start(d: Path, spec: LaunchSpec, build_name: str, config_path: str, reason: str,
                entry: dict | None = None, **facts) -> dict:
    """launch.json at the start. `entry`: the models.toml entry launched, secrets redacted (desired.settings_of),
    so that what changed in models.toml since this launch can be said later (`servedeck page`); `facts`: what
    else is known before the spawn (the build's engine version, the GPUs' PCI addresses)."""
    atomic_write_text(d / "cmd.sh", cmd_sh(spec, build_name, config_path), mode=0o755)
    rec = {"schema": 1, "model": spec.model, "engine": spec.engine, "build": build_name, "slot": spec.slot,
           "port": spec.port, "spec": spec.to_json(), "config_path": config_path, "reason": reason,
           "state": "starting", "started_at": now_iso(), "launch_dir": str(d),
           **({"entry": entry} if entry is not None else {}), **facts}
    atomic_write_json(d / "launch.json", rec)
    return rec


def read_launch(d: Path) -> dict:
    """launch.json; {} when there is none or it is not a JSON object."""
    try:
        doc = json.loads((Path(d) / "launch.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def update_launch(d: Path, **changes) -> dict:
    """Merge `changes` into launch.json. One that cannot be read is kept as launch.json.corrupt (evidence)
    and the record goes on from what this launch knows now."""
    path = Path(d) / "launch.json"
    rec = read_launch(d)
    if not rec and path.exists():
        try:
            os.replace(path, path.with_name("launch.json.corrupt"))
        except OSError:
            pass
    rec.update(changes)
    atomic_write_json(path, rec)
    return rec


def log_tail(d: Path, lines: int = 30) -> str:
    return tail_text(Path(d) / "engine.log", lines)


def log_for_causes(d: Path) -> str:
    """engine.log whole, or its head and tail when very large (forensics.read_log): what a cause is looked for in."""
    return read_log(Path(d) / "engine.log")


def pids_seen(d: Path) -> list[int] | None:
    """Every pid the launch's process group had, as its shim noted them; None when it noted none (a
    launch from before the shim kept them: then the engine's own children are not known)."""
    try:
        pids = json.loads((Path(d) / "pids.json").read_text()).get("pids")
    except (FileNotFoundError, json.JSONDecodeError, AttributeError):
        return None
    return [int(p) for p in pids] if isinstance(pids, list) else None


def crash_identity(d: Path, build_name: str) -> dict:
    """What a crash record says it was a crash of: the build, and the engine version the launch ran
    (servedeck `crashes` groups by both; "must not be counted against 0.29.0" is read from them)."""
    rec = read_launch(d)
    return {"build": rec.get("build") or build_name, "engine_version": rec.get("engine_version"),
            "engine_version_source": rec.get("engine_version_source")}


def past_launches(model: str) -> list[Path]:
    base = paths.launches_dir() / paths.component(model)
    return sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.name) if base.exists() else []
