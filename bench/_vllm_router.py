"""vllm-router (the `bench` extra: vllm-router==0.1.17, a Rust router with a Python launcher) as a process in
its own process group, in front of given workers: what the door's replica routing and its added latency are
compared with (bench/routing_side_by_side.py, bench/door_latency.py --vllm-router)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

from servedeck.fsio import head_and_tail  # a Rust panic says why first, then a backtrace fills the tail
from servedeck.supervisor.process import stop_group
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why


def executable() -> str:
    """The venv's `vllm-router`, else one on PATH; a clear error when neither is there."""
    here = Path(sys.executable).parent / "vllm-router"
    if here.exists():
        return str(here)
    found = shutil.which("vllm-router")
    if found:
        return found
    raise SystemExit("vllm-router is not installed: run scripts/setup.sh (it installs pyproject.toml's `bench` "
                     "dependency group, vllm-router==0.1.17), or `.venv/bin/python -m pip install --group bench`")


def version() -> Optional[str]:
    try:
        from importlib.metadata import version as v

        return v("vllm-router")
    except Exception:  # noqa: BLE001 — only recorded in the results
        return None


class VllmRouter:
    """`vllm-router --worker-urls … --policy POLICY` on a free port, at log level warning (the door logs no
    line per request either); started → ready (its /health answers) → stopped (SIGTERM to its group)."""

    def __init__(self, workers: list[str], policy: str, *extra: str,
                 preexec: Optional[Callable[[], None]] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Its Prometheus exporter binds 127.0.0.1:29000 unless told otherwise, and a second router on the machine
        # then panics at start ("failed to install Prometheus metrics exporter: ... Address already in use"): a CI
        # run lost the routing bench's router to the other test worker's. Each router gets a port of its own.
        self.metrics_port = free_port()
        self.policy = policy
        self.log = Path(tempfile.mkstemp(prefix=f"vllm-router-{policy}-", suffix=".log")[1])
        self.argv = [executable(), "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                     "--worker-urls", *workers, "--log-level", "warning",
                     "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port), *extra]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=preexec)
        try:
            wait_healthy(self.proc, self.url, self.log, 60, "vllm-router")
        except BaseException:  # a Ctrl-C while it starts too: the caller never gets it to stop
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc, self.log)


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout_s: float, what: str) -> None:
    """Until `url`/health answers 200; RuntimeError (with the log's tail) when `proc` exits or time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}): {head_and_tail(log, 4000, 2000)[0]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    said = head_and_tail(log, 4000, 2000)[0]
    raise RuntimeError(f"{what} on {url} did not answer /health within {timeout_s:g} s: {said}")


def stop_process(proc: subprocess.Popen, log: Path) -> None:
    """Its whole process group stopped (servedeck's stop_group: SIGTERM, 15 s, SIGKILL), its log removed."""
    if proc.poll() is None:
        stop_group(proc.pid, 15.0)
        proc.wait()
    log.unlink(missing_ok=True)
