"""systemd units for hosts that use systemd. The plain process backend is the default (and what tests use)."""

from __future__ import annotations

import shlex
import sys

from servedeck.engines.base import LaunchSpec


def _exec(argv: list[str]) -> str:
    # systemd's ExecStart quoting is close to the shell's for plain words; shlex.quote is what it accepts.
    return " ".join(shlex.quote(a) for a in argv)


def render_unit(spec: LaunchSpec, config_path: str, home: str) -> str:
    """A unit that runs MODEL through servedeck (`start --foreground`), so the deck records the launch and
    `status`, `logs` and `watch` see it. servedeck stops the engine's process group on SIGTERM (KillMode=mixed
    sends it to servedeck alone) and exits with the engine's code, so Restart=on-failure restarts a crash."""
    argv = [sys.executable, "-m", "servedeck", "--config", config_path, "start", spec.model, "--foreground"]
    secret = [k for k, v in spec.redacted_env().items() if v == "<redacted>"]
    secret_note = (
        f"# {', '.join(secret)}: secrets; if models.toml does not hold them, put them in an EnvironmentFile=\n"
        "# readable only by you.\n" if secret else ""
    )
    return f"""# servedeck-{spec.model}.service, rendered by `servedeck unit {spec.model}` from {config_path}
[Unit]
Description=servedeck: {spec.model} ({spec.engine}) on port {spec.port}
After=network-online.target

[Service]
Type=simple
{secret_note}Environment={shlex.quote(f"SERVEDECK_HOME={home}")}
ExecStart={_exec(argv)}
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec={int(spec.stop_timeout_s) + 30}
Restart=on-failure
RestartSec=60

[Install]
WantedBy=default.target
"""


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
