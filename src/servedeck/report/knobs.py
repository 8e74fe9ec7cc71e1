"""What a run was made with, as a flat table of knobs: build, engine version, every rendered flag and
env var, host, CPUs, GPUs, servedeck version, workload parameters. Two runs' knobs side by side say
what changed between them, and whether one change can be credited with a difference.

Facts come from the run folder alone: cmd.sh (the launch exactly as rendered: flags and env), else
summary.json's `command` and `config`; versions, host and GPUs from summary.json. Secret values are
redacted again here, whatever the writer did.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from servedeck.redact import REDACTED, SECRET_VALUE, is_secret_name

# Knob groups: a variant is its configuration; the workload and prompt seed describe what was asked;
# the layout is a label and the address (port, bind host) is where it listened: a campaign gives every
# variant its own port and names its layout after the variant, and neither changes what is measured.
WORKLOAD_PREFIX = "workload "
ADDRESS_PREFIX = "address "
NOT_CONFIG = (WORKLOAD_PREFIX, "prompt seed", "layout", ADDRESS_PREFIX)


def address_flags(engine: str) -> set[str]:
    """The flags that only say where a server listens, from the engine's adapter (owned port/host)."""
    try:
        from servedeck.engines import get_engine

        owned = get_engine(engine).owned_flags
        return {f for f, key in owned.items() if key in ("port", "host")}
    except Exception:  # an engine not registered here (a plugin's runs read elsewhere)
        return {"--port", "--host"}


def redact(name: str, value: str) -> str:
    """The deck's own rule (engines.base: secret names, token-formatted values), applied again here."""
    if is_secret_name(name) or SECRET_VALUE.search(value):
        return REDACTED
    return value


def parse_cmd_sh(text: str) -> tuple[list[str], dict[str, str]]:
    """cmd.sh (deck/launch.py writes it) back into argv and env."""
    env: dict[str, str] = {}
    body = text.replace("\\\n", " ")
    argv: list[str] = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = " ".join(shlex.split(value)) if value else ""
        elif line.startswith(': "${') and ":?" in line:
            env[line[len(': "${'):line.index(":?")]] = REDACTED
        elif line.startswith("exec "):
            argv = shlex.split(line[len("exec "):])
    return argv, env


def _is_flag(tok: str) -> bool:
    return bool(re.match(r"^--?[A-Za-z]", tok))


def flags_of(argv: list[str]) -> dict[str, str]:
    """argv → {"executable": …, "--flag": value}. A flag takes the next token as its value unless that
    token is itself a flag (a bare switch then reads "on"); a repeated flag keeps every value."""
    out: dict[str, str] = {}
    if not argv:
        return out
    out["executable"] = argv[0]
    i, pos = 1, 0
    while i < len(argv):
        tok = argv[i]
        if _is_flag(tok):
            name, eq, val = tok.partition("=")
            if not eq:
                if i + 1 < len(argv) and not _is_flag(argv[i + 1]):
                    val = argv[i + 1]
                    i += 1
                else:
                    val = "on"
            val = redact(name, val)
            out[name] = f"{out[name]}, {val}" if name in out else val
        else:
            pos += 1
            out[f"argument {pos}"] = redact("", tok)
        i += 1
    return out


def launch_of(path: Path, summary: dict[str, Any]) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, where from): cmd.sh when the folder has it, else summary.json."""
    cmd = path / "cmd.sh"
    if cmd.exists():
        try:
            argv, env = parse_cmd_sh(cmd.read_text())
            if argv:
                return argv, env, "cmd.sh"
        except (OSError, ValueError):
            pass
    config = summary.get("config") or {}
    env = {**((config.get("build") or {}).get("env") or {}), **((config.get("model") or {}).get("env") or {})}
    return list(summary.get("command") or []), env, "summary.json"


def _each(values: list[str]) -> str:
    """One value when every GPU has it, else each GPU's in index order."""
    return values[0] if len(set(values)) == 1 else ", ".join(values)


def gpu_facts(gpus: dict[str, Any]) -> dict[str, str]:
    """Driver, memory and power limit of the host's GPUs (summary.json `gpus`, read through NVML when the
    run opened): facts that change what a GPU can do, so "what changed" names them. None on a CPU host."""
    if not gpus.get("available") or not gpus.get("gpus"):
        return {}
    each = gpus["gpus"]
    driver = str(gpus.get("driver_version") or "-")
    if gpus.get("cuda_driver_version"):
        driver += f" (CUDA {gpus['cuda_driver_version']})"
    mem = [f"{g['memory_total'] / 2**30:.1f} GiB" if isinstance(g.get("memory_total"), (int, float)) else "-"
           for g in each]
    power = [f"{g['power_limit_w']:.0f} W" if isinstance(g.get("power_limit_w"), (int, float)) else "-" for g in each]
    return {"GPU driver": driver, "GPU memory": _each(mem), "GPU power limit": _each(power)}


def knobs_of(path: Path, summary: dict[str, Any]) -> dict[str, str]:
    """Every knob of one run, as text (a missing fact reads "-")."""
    def s(v: Any) -> str:
        return "-" if v is None or v == "" else str(v)

    argv, env, _ = launch_of(path, summary)
    config = summary.get("config") or {}
    build = config.get("build") or {}
    versions = summary.get("versions") or {}
    host = summary.get("host") or {}
    gpus = summary.get("gpus") or {}
    k: dict[str, str] = {
        "model": s(summary.get("model")),
        "build": s(config.get("build_name")) + (f" ({build.get('binary') or build.get('python') or build.get('image')})"
                                                if build else ""),
        "engine": s(summary.get("engine")),
        "engine version": s(versions.get("engine_version")),
        "servedeck version": s(versions.get("servedeck")),
        "layout": s(summary.get("layout")),
        "context": s(summary.get("context")),
        "host": s(host.get("hostname")),
        "CPUs": f"{s(host.get('cpus_usable') or host.get('cpus'))} × {s(host.get('cpu_model'))}",
        "GPUs": ", ".join(str(g.get("name")) for g in gpus.get("gpus", [])) if gpus.get("available") else "none",
        **gpu_facts(gpus),
    }
    where = address_flags(str(summary.get("engine") or ""))
    for name, value in flags_of(argv).items():
        k[name if not name.startswith("-") else f"{ADDRESS_PREFIX}{name}" if name in where else f"flag {name}"] = value
    for name, value in sorted(env.items()):
        k[f"env {name}"] = redact(name, str(value))
    workload = summary.get("workload") or {}
    for name, value in workload.items():
        if name != "points":
            k[f"{WORKLOAD_PREFIX}{name}"] = s(value)
    k["prompt seed"] = s(summary.get("prompt_seed"))
    return k


def config_knobs(knobs: dict[str, str]) -> dict[str, str]:
    """The knobs that make a variant (what was launched, where), not what was asked of it."""
    return {k: v for k, v in knobs.items() if not k.startswith(NOT_CONFIG)}


def changed(a: dict[str, str], b: dict[str, str]) -> list[tuple[str, str, str]]:
    """(knob, A's value, B's value) for every knob that differs, in A's order then B's extras."""
    names = list(a) + [n for n in b if n not in a]
    return [(n, a.get(n, "(absent)"), b.get(n, "(absent)")) for n in names if a.get(n) != b.get(n)]
