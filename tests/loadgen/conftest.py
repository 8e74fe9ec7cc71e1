"""The instrument in a subprocess of its own process group, killed by group when the tests end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class InstrumentProc:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "servedeck.loadgen.instrument", "--port", "0", *args],
            stdout=subprocess.PIPE, text=True, start_new_session=True,  # own group: no orphans
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "READY" not in line:
            self.stop()
            raise RuntimeError(f"instrument did not start: {line!r}")
        self.port = int(line.split("port=")[1])
        self.url = f"http://127.0.0.1:{self.port}"

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


@pytest.fixture(scope="module")
def instrument_factory() -> Iterator[Callable[..., InstrumentProc]]:
    """instrument_factory("--ttft-ms", "50", ...) -> a running instrument, shared per argument list."""
    started: dict[tuple[str, ...], InstrumentProc] = {}

    def get(*args: str) -> InstrumentProc:
        if args not in started:
            started[args] = InstrumentProc(*args)
        inst = started[args]
        inst.clear()
        return inst

    yield get
    for inst in started.values():
        inst.stop()


@pytest.fixture
def instrument(instrument_factory: Callable[..., InstrumentProc]) -> InstrumentProc:
    return instrument_factory("--ttft-ms", "50", "--itl-ms", "20", "--tokens", "100")
