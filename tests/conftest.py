"""Shared fixtures. Every test gets its own SERVEDECK_HOME (no test can touch real state), and no
process a test started may outlive the session: each test's live engines are stopped by process
group after it, and the session ends by checking that nothing this session started is still running.

How the guard finds them: this session puts its pid in SERVEDECK_TEST_RUN in its own environment
before the first test, so everything it starts inherits the mark, whoever starts it: an engine
under any fixture (per test, per module or per session, as the campaign's shared servers are), the
shim and engine that a `servedeck` CLI subprocess launches, the door (`servedeck serve`), Chromium
and its helpers, Ray's head and nodes (gcs_server, raylet, their workers), the timing instrument and
the load generator's client processes. A process that rebuilt its environment from nothing is still
found if it is a descendant of this session. Marks are per session: another engineer's pytest on the
same machine has its own, and its processes are none of this session's business. Under two pytest-xdist workers
(the default of scripts/test.sh, tests/workers.py), each worker is such a session, with its own mark and its own guard."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from servedeck.modelsfile import load
from servedeck.init import default_locations
from workers import as_a_worker, by_group

TEST_MARK = "SERVEDECK_TEST_RUN"
SESSION = str(os.getpid())  # every process this session starts inherits it (pytest_configure below)
# How long the guard lets processes that are still shutting down (a Ray worker after cluster
# shutdown, a browser's helpers) end on their own before it calls them left behind.
GUARD_WAIT_S = float(os.environ.get("SERVEDECK_TEST_GUARD_WAIT_S", "20"))


def pytest_configure(config):
    # In os.environ, not per test: a session- or module-scoped fixture starts its servers before any
    # test's monkeypatch, and subprocesses (CLI, Ray, Chromium) copy os.environ.
    os.environ[TEST_MARK] = SESSION
    # A suite started in the background of a non-interactive shell (`bash scripts/test.sh &`) inherits SIGINT
    # ignored, and so does every servedeck it starts (an ignored signal stays ignored across exec): the
    # Ctrl-C tests then send a Ctrl-C nobody receives. They play a user at a terminal, so the suite restores
    # Python's own handler; a handled signal is reset to the default in each child, which installs its own.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    as_a_worker(os.environ)  # tests/workers.py: under two workers, each engine keeps to its share of the cores


# --- two workers (scripts/test.sh's default): tests/workers.py says how tests are grouped onto them
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return by_group(config, log)


@pytest.fixture(autouse=True)
def servedeck_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SERVEDECK_HOME", str(home))
    monkeypatch.setenv(TEST_MARK, SESSION)
    monkeypatch.delenv("SERVEDECK_CONFIG", raising=False)
    yield home
    stop_everything(home)


def stop_everything(home: Path) -> None:
    """Stop, by process group, every engine still recorded live under `home`; a record written before
    its spawn has no pgid yet, and its shim is found by its launch folder as the deck finds it."""
    from servedeck.supervisor.process import find_shim, group_members, stop_group

    import json

    live = home / "live"
    for f in live.glob("*.json") if live.exists() else ():
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict):  # a test that damages a record on purpose: found by its launch below
            continue
        pgid, born = rec.get("pgid"), rec.get("create_time")
        if pgid is None and rec.get("launch_dir"):
            shim = find_shim(rec["launch_dir"])
            pgid, born = (shim.pgid, shim.create_time) if shim is not None else (None, None)
        # by the shim's start time too: a record left by a test that killed its engine names a number that
        # the kernel may since have given to another worker's shim, whose engine this must not stop
        if isinstance(pgid, int) and group_members(pgid):
            stop_group(pgid, 10, leader_create_time=born)
    # an engine whose record a test damaged or removed: its shim names its launch folder
    for d in (home / "launches").glob("*/*") if (home / "launches").exists() else ():
        shim = find_shim(d)
        if shim is not None:
            stop_group(shim.pgid, 10, leader_create_time=shim.create_time)


# Processes that belong to this session's interpreter itself and end with it, not with any test.
INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def processes_of_this_session() -> list[psutil.Process]:
    """Every live process started by this session: marked with its SESSION, or descended from it."""
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(TEST_MARK) == SESSION:
                found[p.pid] = p
        except (psutil.Error, OSError):
            continue
    try:
        for p in psutil.Process(me).children(recursive=True):
            found.setdefault(p.pid, p)
    except psutil.Error:
        pass
    out = []
    for p in found.values():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if p.ppid() == me and any(h in cmd for h in INTERPRETER_HELPERS):
            continue
        out.append(p)
    return out


def describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} (group {os.getpgid(p.pid)}): {' '.join(p.cmdline())[:200]}"
    except (psutil.Error, OSError):
        return f"pid {p.pid} (gone while being described)"


def kill_left(left: list[psutil.Process]) -> None:
    """SIGKILL what was left: by process group where it has its own (an engine and its shim, a
    Chromium and its helpers), else the process alone (never this session's own group)."""
    mine = os.getpgid(0)
    for p in left:
        try:
            pgid = os.getpgid(p.pid)
            if pgid != mine:
                os.killpg(pgid, 9)
            else:
                p.kill()
        except (psutil.Error, OSError):
            pass
    psutil.wait_procs(left, timeout=10)


def wait_for_session_processes(wait_s: float) -> list[psutil.Process]:
    """This session's processes still running after up to `wait_s` seconds of letting them end."""
    deadline = time.monotonic() + wait_s
    while True:
        left = processes_of_this_session()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


@pytest.fixture(scope="session", autouse=True)
def no_orphans_at_end():
    """Set up before any other session fixture, so torn down after all of them: the campaign's shared
    servers, Ray clusters and browsers have been stopped by their own fixtures when this looks."""
    yield
    left = wait_for_session_processes(GUARD_WAIT_S)
    if not left:
        return
    names = [describe(p) for p in left]
    kill_left(left)
    raise AssertionError(f"{len(left)} process(es) started by this test session were still running "
                         f"{GUARD_WAIT_S:g} s after the last test (killed now):\n  " + "\n  ".join(names))


# --- the end of the session: pytest's summary, then its own exit code -----------------------------
# After the summary, the interpreter joins every non-daemon thread (and concurrent.futures its workers)
# before it exits; one a test left blocked would hang the run with the count line unwritten. So once
# pytest is done, a bounded wait, then the stacks of what still runs, and pytest's exit code.
EXIT_WAIT_S = float(os.environ.get("SERVEDECK_TEST_EXIT_WAIT_S", "60"))
_exit_status: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    import faulthandler
    import sys
    import threading

    sys.stdout.flush()
    sys.stderr.flush()
    if not _exit_status or config.option.collectonly:
        return
    status = _exit_status[-1]

    def bounded_exit() -> None:
        time.sleep(EXIT_WAIT_S)
        print(f"\npytest finished {EXIT_WAIT_S:g} s ago and the interpreter is still held by threads a test "
              "left running; their stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(status)

    threading.Thread(target=bounded_exit, name="servedeck-test-exit", daemon=True).start()


from ports import free_port, starter_toml  # noqa: E402, F401  (free_port: other tests import it from here; ports below the kernel's ephemeral range: tests/ports.py says why)
# the session's shared real servers, one instance for every directory whose tests only read from them
from shared_servers import campaign_config, campaign_home, gemma, llama, llama_spec, vllm  # noqa: E402, F401


@pytest.fixture(scope="session")
def engines_ready() -> dict[str, str]:
    """Paths of the real engines and models that scripts/setup.sh prepared; fail loudly when missing."""
    loc = default_locations()
    missing = [f"{k}={v}" for k, v in loc.items() if k != "cache" and not Path(v).exists()]
    if missing:
        pytest.fail("engines/models not prepared (run scripts/setup.sh): " + ", ".join(missing))
    return loc


@pytest.fixture
def deck_config(tmp_path, engines_ready):
    """The starter models.toml with free ports, written where a user would keep it."""
    text = starter_toml()
    path = tmp_path / "models.toml"
    path.write_text(text)
    return load(path)


@pytest.fixture
def llama_server(engines_ready):
    return engines_ready["llama_server"]
