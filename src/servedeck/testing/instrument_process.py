"""The instrument in a process of its own (its own process group), for the tests and the bench.

Target and client must not share an event loop: the point is to measure the client's error with
the instrument's clock running independently, as an engine's would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any


class InstrumentProcess:
    """`python -m servedeck.testing.instrument ARGS` on a free port; `stop` ends the whole group."""

    def __init__(self, *args: str, cpus: set[int] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "servedeck.testing.instrument", "--port", "0", *args],
            stdout=subprocess.PIPE, text=True, start_new_session=True,  # own group: no orphans
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "READY" not in line:
            self.stop()
            raise RuntimeError(f"instrument did not start: {line!r}")
        fields = dict(f.split("=", 1) for f in line.split()[2:])  # "INSTRUMENT READY port=P loop=L"
        self.port = int(fields["port"])
        self.loop = fields.get("loop", "")
        self.url = f"http://127.0.0.1:{self.port}"
        self.pinned: set[int] | None = None  # the CPUs it was held to, None if not (or refused)
        if cpus:
            try:
                os.sched_setaffinity(self.proc.pid, cpus)
                self.pinned = set(os.sched_getaffinity(self.proc.pid))
            except OSError:  # a sandbox may not allow it: the run says so instead of failing
                self.pinned = None

    def clear(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.url + "/records", method="DELETE")).read()

    def records(self) -> dict[str, dict[str, Any]]:
        data = json.load(urllib.request.urlopen(self.url + "/records"))
        return {r["id"]: r for r in data["records"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
