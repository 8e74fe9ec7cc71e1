"""The client of tests/capacity/test_client_bound_llamacpp.py, run as its own process: a max-rate capacity search
whose client is held to one core at nice 19, where a group of busy loops (started stopped by the test) runs only
while a point is in its measured phase. The loops are woken when a point's measured phase starts and stopped when
the point is done, so the client's start-up, its warm-up and its extra client processes' imports run at full
speed, and only the measured phase is short of CPU.

    python starved_client.py MODELS_TOML MODEL CLIENT_CPU HOG_PGID

Prints the run folder on its last line.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

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


class Starver(QuietReporter):
    """Wakes the busy loops when a point's measured phase starts and stops them once its last request is in (what
    the point does after, its figures and files, is not measured, and at nice 19 beside them takes minutes)."""

    def __init__(self, hogs: int):
        self.hogs = hogs
        self.busy = False

    def progress(self, label: str, p: Any) -> None:
        if p.phase != "measured":
            return
        if not self.busy and p.done == 0:
            self._set(True)
        elif self.busy and p.total is not None and p.done >= p.total:
            self._set(False)

    def point_done(self, label: str, point: dict[str, Any]) -> None:
        if self.busy:
            self._set(False)

    def _set(self, busy: bool) -> None:
        os.killpg(self.hogs, signal.SIGCONT if busy else signal.SIGSTOP)
        self.busy = busy


def main(argv: list[str]) -> None:
    config, model, cpu, hogs = argv
    cfg = load(Path(config))
    bench = BenchSpec(shapes=(), **POINT)
    cspec = CapacitySpec(find="max-rate", slo=parse_slo(SLO), bench=bench,
                         max_load=RATE, start=RATE, arrivals="constant", resolution=Resolution(relative=0.5))
    # The process and whatever it starts (its client processes inherit both) on one core, below the busy loops.
    os.sched_setaffinity(0, {int(cpu)})
    os.nice(19)
    out = Outcome()
    with measured(cfg, model, False, out) as target:
        run_loop(capacity(target, cspec, gate_mode=False, outcome=out, reporter=Starver(int(hogs))))
    print(out.folder, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
