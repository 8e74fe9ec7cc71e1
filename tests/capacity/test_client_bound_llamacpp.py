"""A point whose one client process is short of CPU, on a real llama-server: called client-bound, measured again
with more client processes, and the run folder says so (issue 47).

The engine: SmolLM2 on llama.cpp (4 slots, one thread) pinned to one core by its models.toml `cpus`, booted for
this module. The client: a max-rate capacity search at 0.5 requests/s, constant arrivals (tests/capacity/
starved_client.py), in a process of its own; in each point's measured phase, and only there, its sending
processes are held to the other core at nice 19 beside three busy loops at nice 0 held there too, which run only
then. The shortage is the kernel's, read back from /proc schedstat: nothing about the client's CPU is injected.

Why this shape (each measured here, 2026-12-06, on the loaded 2-core box):
- A busy loop at the client's own priority does not starve it: a client that sleeps between chunks is run as soon
  as it wakes (beside one loop, 0.6 % of its window waiting for its core; at nice 10, 3.5 %). And Linux shares a
  core between sessions (autogroups) before it shares it between their processes, so nice counts only within a
  session: the loops and the client are started in this test's session, each in a process group of its own.
- Only the measured phases are short of CPU, the same for both points. Busy loops for the whole run made the
  client's start-up, its second client processes' imports and each point's files take minutes at nice 19, so
  between measured phases they are stopped (SIGSTOP). And the client itself is niced and held to the loops' core
  only in measured phases (f81f8aa held it so for the whole run): the client processes the retry spawns inherit
  the spawning thread's nice and the process's cores, and in a fresh-clone CI run (two pytest-xdist workers on
  two cores) the two of them, importing at nice 19 on one core beside the other worker's work, were not ready
  after 120 s (e209e64 withdrew the test for it). Renicing back to 0 needs CAP_SYS_NICE or an RLIMIT_NICE of 20:
  the test skips where neither holds.
- An open loop: in a closed loop the next send follows the previous answer's end in the same run of the client's
  loop, so a client that waits for its core stamps late but sends on time (lag p99 3 ms at 32 % of its window
  waiting); an open loop's sends are timed, and a late wake-up is a late send (p99 541-750 ms).

What must hold, whatever the box's load: at 0.5/s with one client process, the client waited for its core at
least a quarter of its window and its sends were late by more than 5 % of the 1 s TTFT limit, so the point is no
result and the search measures it again with two client processes, the cap (--max 0.5) leaving it no other load.
Whether two processes on the same starved core cure it is not asked (they did not: both measures client-bound,
the search stops so). At f81f8aa, six runs here (load 9-12): 2 passed each, 49-58 s; the first point waited for
its core 46-67 % of its window, lag p99 320-725 ms (8 to 10 of 10 sends past 50 ms).
Niced and held only in measured phases, with six loops (three left the first point waiting 30 % of its window on a
quiet box, against the rule's 25 %), eleven runs here on 2026-12-06, each "2 passed" (the load average is the 1-min
one over the run, which the loops themselves raise by up to six while they run): five in a row alone (18:47-18:51
UTC, 43-50 s each, load 6-10, other sessions' tune tests beside them) and one more before them (47 s, load 1.6-5.9);
twice with `-n 2` beside tests/capacity/test_steady_state_llamacpp.py and tests/campaign/test_bench.py (the capacity
directory on one worker, the bench's llama.cpp and vLLM runs on the other the whole time: 11 passed in 283 s at load
3.5-9.6 and 259 s at load 2.5-5.2); and three times alone beside busy Python loops at nice 0 in the same session
(unpinned: two, 46 s, load 2.8-5.1; four, 54 s at load 2.5-7.2 and 72 s at load 5.5-10.5). The first point waited
for its core 45-86 % of its window, lag p99 134-1962 ms; the retry's two processes 16-39 % each, lag p99 438-1150
ms. Sampled every 0.2 s in the last run: the client at nice 0 on cores 0-1 until the first measured phase, nice 19
on core 1 in it, back to 0 at its last request and to 0-1 once the point was done; the retry's two processes started
at nice 0 on 0-1 and were at nice 19 on core 1 3.5-4.5 s after spawning, ready and in their measured phase.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from servedeck.modelsfile import load
from servedeck.supervisor.process import group_members, stop_group
from ports import free_port, starter_toml
from shared_servers import shared_server

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

HOGS = 6  # busy loops beside the client: one left it waiting 13-19 % of its window, three 53-60 % (a closed loop); in
# measured phases only (an open loop, a quiet box), three 30 % (the rule is 25 %), six 70 %
CLIENT = Path(__file__).with_name("starved_client.py")
MODEL = "smollm2-pinned"
SEARCH_TIMEOUT_S = 900  # the search took 48 s here at load 11


def _cores() -> tuple[int, int]:
    """(the engine's core, the client's core): two of the cores this test may use."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores: one for the engine, one for the client and the busy loops")
    return cpus[0], cpus[1]


@pytest.fixture(scope="module")
def pinned(capacity_home, tmp_path_factory, engines_ready) -> Iterator[tuple[Path, int]]:
    """SmolLM2 on llama.cpp pinned to one core, one thread, 4 slots; (its models.toml, the client's core)."""
    engine_cpu, client_cpu = _cores()
    text = starter_toml()
    source = re.search(r'\[models\.smollm2\]\n(?:.*\n)*?source = "([^"]+\.gguf)"', text)
    assert source
    text += (f'\n[models.{MODEL}]\nsource = "{source.group(1)}"\nbuild = "llamacpp"\nport = {free_port()}\n'
             f'slot = "pinned"\ncontext = 4096\ncpus = [{engine_cpu}]\nargs = {{ parallel = 4, threads = 1 }}\n')
    path = tmp_path_factory.mktemp("pinned-config") / "models.toml"
    path.write_text(text)
    for _ in shared_server(load(path), capacity_home, MODEL):
        yield path, client_cpu


# a busy loop held to the core in argv, stopped by itself before it loops (woken by the client's SIGCONT)
HOG = ("import os, signal, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nos.kill(os.getpid(), signal.SIGSTOP)\n"
       "while True:\n    pass\n")


def _stopped_hogs(cpu: int) -> list[subprocess.Popen]:
    """HOGS busy loops on `cpu`, in one process group of their own, each stopped before its first loop."""
    hogs: list[subprocess.Popen] = []
    for _ in range(HOGS):
        hogs.append(subprocess.Popen([sys.executable, "-c", HOG, str(cpu)],
                                     process_group=hogs[0].pid if hogs else 0))
    deadline = time.monotonic() + 120
    while any(psutil.Process(h.pid).status() != psutil.STATUS_STOPPED for h in hogs):
        assert time.monotonic() < deadline, "the busy loops did not stop themselves within 120 s"
        time.sleep(0.05)
    return hogs


def _can_renice() -> bool:
    """Whether a process here may go back from nice 19 to 0 (CAP_SYS_NICE, or an RLIMIT_NICE hard limit of 20,
    which starved_client.py raises its own soft limit to): the client must, after each measured phase."""
    if os.geteuid() == 0:
        return True
    hard = resource.getrlimit(resource.RLIMIT_NICE)[1]
    return hard == resource.RLIM_INFINITY or hard >= 20


@pytest.fixture(scope="module")
def starved(pinned, capacity_home, tmp_path_factory) -> tuple[dict, dict]:
    """The search's search.json and summary.json."""
    if not _can_renice():
        pytest.skip("the client must go back from nice 19 to 0 after each measured phase: needs root or an "
                    "RLIMIT_NICE hard limit of 20")
    config, cpu = pinned
    env = dict(os.environ, SERVEDECK_HOME=str(capacity_home),
               SERVEDECK_RESULTS=str(tmp_path_factory.mktemp("starved-results")))
    hogs = _stopped_hogs(cpu)
    client = None
    try:
        # in this session (process_group, not a new session): nice 19 weighs against the loops only there
        client = subprocess.Popen([sys.executable, str(CLIENT), str(config), MODEL, str(cpu), str(hogs[0].pid)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  process_group=0)
        out, err = client.communicate(timeout=SEARCH_TIMEOUT_S)
    finally:
        if client is not None and group_members(client.pid):
            stop_group(client.pid, 10)  # its client processes are in its group
        os.killpg(hogs[0].pid, signal.SIGKILL)
        for h in hogs:
            h.wait()
        if client is not None:
            client.wait()
    assert client.returncode == 0, err[-3000:]
    folder = Path(out.strip().splitlines()[-1])
    return json.loads((folder / "search.json").read_text()), json.loads((folder / "summary.json").read_text())


def test_a_client_short_of_cpu_is_measured_again_with_more_client_processes(starved):
    doc, _ = starved
    first, again = doc["steps"][0], doc["steps"][1]
    judged = first["judged"]
    assert first["load"] == 0.5 and judged["client_procs"] == 1, first
    assert judged["client_bound"] and judged["client_kind"] == "short", judged
    assert any("waited for a core" in r or "CPU" in r for r in judged["client_reasons"]), judged["client_reasons"]
    assert any(r.startswith("schedule lag p99") for r in judged["client_reasons"]), judged["client_reasons"]
    assert again["load"] == 0.5 and again["phase"] == "retry" and again["judged"]["client_procs"] >= 2, again
    assert doc["client_procs"]["count"] >= 2 and "client processes" in doc["client_procs"]["why"], doc["client_procs"]
    assert any("short of CPU" in n and "measured again with" in n for n in doc["notes"]), doc["notes"]


def test_the_run_folder_keeps_the_evidence(starved):
    doc, summary = starved
    one, more = summary["points"][0], summary["points"][1]
    client = one["figures"]["client"]
    assert client["processes"] == 1 and client["short"], client
    assert client["wait_fraction"] >= 0.25 or client["cpu_fraction"] >= 0.9, client
    assert client["lag_ms"]["p99"] > 50 and client["host"]["cores"] == 1, client
    assert more["client_procs"] >= 2 and more["figures"]["client"]["processes"] == more["client_procs"], more
    per = more["figures"]["client"]["per_process"]
    assert len(per) == more["client_procs"] and all(p["wait_s"] is not None for p in per), per
    assert summary["capacity"]["client_procs"] == doc["client_procs"], summary["capacity"]
    assert summary["capacity"]["notes"] == doc["notes"]
