"""systemd units for hosts that use systemd. The plain process backend is the default (and what tests use)."""

from __future__ import annotations

import shlex
import sys

from servedeck.engines.base import LaunchSpec


def _exec(argv: list[str]) -> str:
    # systemd's ExecStart quoting is close to the shell's for plain words; shlex.quote is what it accepts.
    return " ".join(shlex.quote(a) for a in argv)


def render_unit(spec: LaunchSpec, config_path: str, home: str, restart: str = "on-failure") -> str:
    """A unit that runs MODEL through servedeck (`start --foreground`), so the deck records the launch and
    `status`, `logs` and `watch` see it. servedeck stops the engine's process group on SIGTERM (KillMode=mixed
    sends it to servedeck alone) and exits with the engine's code, so Restart=on-failure restarts a crash.
    `restart` is models.toml's unit_restart; TimeoutStopSec is the model's stop_timeout_s, as seed 004
    writes both (Restart=always, TimeoutStopSec=120)."""
    argv = [sys.executable, "-m", "servedeck", "--config", config_path, "start", spec.model, "--foreground"]
    secret = [k for k, v in spec.redacted_env().items() if v == "<redacted>"]
    secret_note = (
        f"# {', '.join(secret)}: secrets; if models.toml does not hold them, put them in an EnvironmentFile=\n"
        "# readable only by you.\n" if secret else ""
    )
    unit = f"servedeck-{spec.model}"
    if restart == "always":
        restart_note = (f"# Restart=always (unit_restart): systemd starts the model again after any end, a\n"
                        f"# `servedeck stop {spec.model}` included; `systemctl stop {unit}` keeps it stopped.\n")
    else:
        restart_note = (f"# Restart={restart} (unit_restart): servedeck exits with the engine's code when it\n"
                        f"# crashes, 0 after `servedeck stop {spec.model}` or `systemctl stop {unit}`.\n")
    return f"""# {unit}.service, rendered by `servedeck unit {spec.model}` from {config_path}
[Unit]
Description=servedeck: {spec.model} ({spec.engine}) on port {spec.port}
After=network-online.target

[Service]
Type=simple
{secret_note}Environment={shlex.quote(f"SERVEDECK_HOME={home}")}
ExecStart={_exec(argv)}
# KillMode=mixed: systemd's SIGTERM goes to servedeck alone, which stops the engine's process group
# and records the stop; systemd's default would signal the engine behind the deck's back.
KillMode=mixed
KillSignal=SIGTERM
# TimeoutStopSec: the model's stop_timeout_s, the engine's grace between SIGTERM and SIGKILL. An
# engine that needs all of it meets systemd's SIGKILL (to every process of the unit, servedeck
# too) when servedeck would have sent its own; the next servedeck command records it stopped.
TimeoutStopSec={_seconds(spec.stop_timeout_s)}
{restart_note}Restart={restart}
RestartSec=60

[Install]
WantedBy=default.target
"""


def _seconds(s: float) -> str:
    """A time span as systemd reads it: whole seconds bare (120), a fraction with its unit (2.5s)."""
    return str(int(s)) if float(s).is_integer() else f"{s:g}s"


def render_watch_unit(config_path: str, interval_s: float) -> str:
    argv = [sys.executable, "-m", "servedeck", "--config", config_path, "watch", "--interval", f"{interval_s:g}s"]
    return f"""# servedeck-watch.service, rendered by `servedeck unit --watch`
[Unit]
Description=servedeck watch loop: keeps desired models running, with notices
After=network-online.target

[Service]
Type=simple
ExecStart={_exec(argv)}
Restart=always
RestartSec=10
TimeoutStopSec=150

[Install]
WantedBy=default.target
"""
