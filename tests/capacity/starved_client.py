"""The client of tests/capacity/test_client_bound_llamacpp.py, run as its own process: a max-rate capacity search
whose client is short of CPU in each point's measured phase, and only there. When a measured phase starts the
client's sending processes (this one, or the client processes a point spawned) are held to one core at nice 19
and a group of busy loops there (started stopped by the test) is woken; once the phase's last request is in the
loops are stopped and the client is back at its own priority, and when the point is done (its figures and files
written) back on its own cores. So the client's start-up, its warm-ups and the imports of the client processes
a retry spawns run at normal priority on every core (they inherit the spawning thread's nice and the process's
cores, procs.py: spawned beside another pytest worker's work at nice 19 on one core, they were not ready after
120 s), and only the measured phases are short of CPU, the same for both points.

    python starved_client.py MODELS_TOML MODEL CLIENT_CPU HOG_PGID

Prints the run folder on its last line.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import psutil

from servedeck.loadgen.loop import run as run_loop
from servedeck.modelsfile import load
from servedeck.slo import parse_slo
from servedeck.workloads.capacity import CapacitySpec
from servedeck.workloads.points import BenchSpec
from servedeck.workloads.reporter import QuietReporter
from servedeck.workloads.search import Resolution
from servedeck.workloads.session import Outcome, measured, run as capacity

RATE = 0.5  # requests/s, constant arrivals: the search's first and only load (its max)
SLO = "ttft_p90<=1s"  # 5 % of it is 50 ms: a send later than that can move what the SLO reads
POINT = dict(workload="chat", input_tokens=64, output_tokens=8, requests=10, warmup=1)
NICE = 19  # the client's nice in a measured phase, below the busy loops' 0


def _threads(pid: int) -> list[int]:
    """Every thread of process `pid` (Linux sets a nice and a core set per thread); none if it has ended."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _senders() -> list[int]:
    """The processes that send the requests: the client processes this one spawned for the point
    (multiprocessing's spawn_main; not its resource tracker), else this one."""
    spawned = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("spawn_main" in part for part in child.cmdline()):
                spawned.append(child.pid)
        except psutil.Error:
            continue
    return spawned or [os.getpid()]


class Starver(QuietReporter):
    """Holds the client's sending processes to the busy loops' core at nice 19 and wakes the loops when a point's
    measured phase starts; stops the loops and gives the client its own nice back once the phase's last request
    is in (what the point does after, its figures and files, is not measured, and at nice 19 beside them takes
    minutes), and its own cores once the point is done: the phase's closing host reading (host_cores, after the
    last request) must see the cores the phase ran on."""

    def __init__(self, hogs: int, cpu: int):
        self.hogs, self.cpu = hogs, cpu
        self.busy = False
        self.nice0 = os.getpriority(os.PRIO_PROCESS, 0)  # the client's own, restored between measured phases
        self.cores0 = os.sched_getaffinity(0)
        self.held: list[int] = []  # the sending processes held during the current point

    def progress(self, label: str, p: Any) -> None:
        if p.phase != "measured":
            return
        if not self.busy and p.done == 0:
            self.held = _senders()
            self._set(nice=NICE, cores={self.cpu})
            os.killpg(self.hogs, signal.SIGCONT)
            self.busy = True
        elif self.busy and p.total is not None and p.done >= p.total:
            self._quiet()

    def point_done(self, label: str, point: dict[str, Any]) -> None:
        self.release()

    def release(self) -> None:
        """The loops stopped, the client at its own nice on its own cores (idempotent)."""
        if self.busy:
            self._quiet()
        self._set(cores=self.cores0)
        self.held = []

    def _quiet(self) -> None:
        os.killpg(self.hogs, signal.SIGSTOP)
        self.busy = False
        self._set(nice=self.nice0)

    def _set(self, nice: int | None = None, cores: set[int] | None = None) -> None:
        for pid in self.held:
            for tid in _threads(pid):
                try:
                    if nice is not None:
                        os.setpriority(os.PRIO_PROCESS, tid, nice)
                    if cores is not None:
                        os.sched_setaffinity(tid, cores)
                except ProcessLookupError:  # a client process that has just ended
                    continue


def main(argv: list[str]) -> None:
    config, model, cpu, hogs = argv
    # Back from nice 19 to 0 needs CAP_SYS_NICE or an RLIMIT_NICE of 20 (the test skips where neither holds)
    _, hard = resource.getrlimit(resource.RLIMIT_NICE)
    if hard == resource.RLIM_INFINITY or hard >= 20:
        resource.setrlimit(resource.RLIMIT_NICE, (hard, hard))
    cfg = load(Path(config))
    bench = BenchSpec(shapes=(), **POINT)
    cspec = CapacitySpec(find="max-rate", slo=parse_slo(SLO), bench=bench,
                         max_load=RATE, start=RATE, arrivals="constant", resolution=Resolution(relative=0.5))
    starver = Starver(int(hogs), int(cpu))
    out = Outcome()
    try:
        with measured(cfg, model, False, out) as target:
            run_loop(capacity(target, cspec, gate_mode=False, outcome=out, reporter=starver))
    finally:
        starver.release()
    print(out.folder, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
