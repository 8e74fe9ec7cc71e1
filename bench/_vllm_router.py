"""vllm-router (the `bench` extra: vllm-router==0.1.17, a Rust router with a Python launcher) as a process in
its own process group, in front of given workers: what the door's replica routing and its added latency are
compared with (bench/routing_side_by_side.py, bench/door_latency.py --vllm-router)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import httpx


def executable() -> str:
    """The venv's `vllm-router`, else one on PATH; a clear error when neither is there."""
    here = Path(sys.executable).parent / "vllm-router"
    if here.exists():
        return str(here)
    found = shutil.which("vllm-router")
    if found:
        return found
    raise SystemExit("vllm-router is not installed: run scripts/setup.sh (it installs the `bench` extra, "
                     "vllm-router==0.1.17), or `.venv/bin/python -m pip install -e '.[bench]'`")


def version() -> Optional[str]:
    try:
        from importlib.metadata import version as v

        return v("vllm-router")
    except Exception:  # noqa: BLE001 — only recorded in the results
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmRouter:
    """`vllm-router --worker-urls … --policy POLICY` on a free port, at log level warning (the door logs no
    line per request either); started → ready (its /health answers) → stopped (SIGTERM to its group)."""

    def __init__(self, workers: list[str], policy: str, *extra: str,
                 preexec: Optional[Callable[[], None]] = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.policy = policy
        self.log = Path(tempfile.mkstemp(prefix=f"vllm-router-{policy}-", suffix=".log")[1])
        self.argv = [executable(), "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                     "--worker-urls", *workers, "--log-level", "warning", *extra]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=preexec)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"vllm-router did not answer /health within 60 s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.unlink(missing_ok=True)
