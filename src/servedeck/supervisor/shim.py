"""The process servedeck actually spawns: it starts the engine, waits for it, and writes how it ended.

    python -m servedeck.supervisor.shim [--env-stdin] [--cpus 0,1] [--owner PID] LAUNCH_DIR -- ARGV...

It leads the engine's process group (the spawner passes start_new_session), so a stop is one
signal to one group. It outlives the engine on purpose: when the engine dies, by a signal or an
exit code, the shim ends whatever the engine left in its group, then writes `exit.json` in the launch
folder, which is how servedeck later says what an engine died of even though servedeck itself was not
running. With --cpus it pins itself to that CPU set before it starts the engine, so the engine and every
process it forks inherit the affinity.
With --owner (a campaign cell on a Ray node: the worker that launched it) it stops its engine's group
when that process is gone, so a lost worker leaves no engine behind. While the engine runs it notes
every pid its group has had in `pids.json`: a kernel Xid names the process that faulted (vLLM's
EngineCore, a worker), and when the crash is read those processes are gone.
With --env-stdin it reads the engine's environment additions as one JSON object from stdin: the shim
itself runs in servedeck's environment (a build's PYTHONPATH must not hide servedeck from it), the
engine in that environment plus the launch's.
Kept tiny: it runs for every launch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time


def main(argv: list[str]) -> int:
    cpus: list[int] = []
    owner = 0
    env_stdin = False
    while argv[:1] == ["--env-stdin"] or (argv[:1] in (["--cpus"], ["--owner"]) and len(argv) > 1):
        if argv[0] == "--env-stdin":
            env_stdin, argv = True, argv[1:]
            continue
        if argv[0] == "--cpus":
            cpus = [int(c) for c in argv[1].split(",") if c]
        else:
            owner = int(argv[1])
        argv = argv[2:]
    launch_dir, sep, *cmd = argv if len(argv) >= 2 else ["", ""]
    if sep != "--" or not cmd:
        print("usage: python -m servedeck.supervisor.shim [--env-stdin] [--cpus 0,1] [--owner PID] LAUNCH_DIR -- ARGV...",
              file=sys.stderr)
        return 2
    engine_env = None
    if env_stdin:  # the engine's environment: the shim's own plus what the spawner sends (process.engine_env)
        try:
            engine_env = {**os.environ, **json.loads(sys.stdin.read() or "{}")}
        except ValueError as e:
            print(f"servedeck: the engine's environment sent to the shim is not JSON: {e}", file=sys.stderr, flush=True)
            _write(launch_dir, {"returncode": 2, "signal": None, "error": "the supervisor got no readable environment "
                                "for the engine", "started_at": time.time(), "ended_at": time.time()})
            return 2
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            print(f"servedeck: cannot pin to CPUs {cpus}: {e.strerror}", file=sys.stderr, flush=True)
            _write(launch_dir, {"returncode": 126, "signal": None, "error": f"cannot pin to CPUs {cpus}: {e.strerror}",
                                "started_at": time.time(), "ended_at": time.time()})
            return 126
    stop_signal: list[int] = []

    def note(signum, _frame):  # the group got the signal too; just remember it and keep waiting
        stop_signal.append(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, note)
    started = time.time()
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=engine_env)
    except OSError as e:
        record = {"returncode": 127, "signal": None, "error": f"cannot execute {cmd[0]}: {e.strerror}",
                  "started_at": started, "ended_at": time.time()}
        print(f"servedeck: cannot execute {cmd[0]}: {e.strerror}", file=sys.stderr, flush=True)
        _write(launch_dir, record)
        return 127
    _write(launch_dir, {"engine_pid": child.pid, "started_at": started}, name="engine.json")
    orphaned: list[int] = []
    if owner:
        threading.Thread(target=_watch_owner, args=(owner, child, orphaned), daemon=True).start()
    group = _Group(launch_dir, {os.getpid(), child.pid})
    threading.Thread(target=group.watch, args=(child,), daemon=True).start()
    while True:
        try:
            rc = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    try:
        group.note()  # what is left of the group as the engine ends (its helpers may outlive it a moment)
    except OSError:
        pass
    stragglers = _end_stragglers()
    record = {
        "returncode": rc if rc >= 0 else None,
        "signal": signal.Signals(-rc).name if rc < 0 else None,
        "stop_signal": signal.Signals(stop_signal[0]).name if stop_signal else None,
        "engine_pid": child.pid,
        **({"owner_gone": orphaned[0]} if orphaned else {}),
        **({"stragglers": stragglers} if stragglers else {}),
        "started_at": started,
        "ended_at": time.time(),
    }
    _write(launch_dir, record)
    return rc if rc >= 0 else 128 - rc


def _group_members(pgid: int) -> list[int]:
    """Live processes of a process group, from /proc (the shim imports nothing it can do without)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def _end_stragglers(grace_s: float = 5.0) -> list[int]:
    """The engine's main process has ended; what it left running in the shim's group ends with it, SIGTERM
    then SIGKILL after `grace_s`. vLLM's API server exits 0 once its EngineCore died and leaves helpers
    behind; without this the shim's exit would look like a supervisor killed beside a live engine.
    The pids it found."""
    def others() -> list[int]:
        return [p for p in _group_members(os.getpgrp()) if p != os.getpid()]

    left = others()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        if not others():
            break
        for p in others():
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while others() and time.monotonic() < deadline:
            time.sleep(0.05)
    return left


def _watch_owner(owner: int, child: subprocess.Popen, orphaned: list[int]) -> None:
    """Poll the owner (a signal-0 probe each second: a pidfd would need Linux 5.3 and Python 3.9's
    os.pidfd_open, polling is enough at this scale); when it is gone, stop the engine's group."""
    while child.poll() is None:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            orphaned.append(owner)
            os.killpg(os.getpgrp(), signal.SIGTERM)  # the shim only notes it; the engine stops
            deadline = time.monotonic() + 20
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if child.poll() is None:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            return
        except PermissionError:
            pass  # alive, another user's
        time.sleep(1.0)


class _Group:
    """The pids of this process group, ever: read from /proc (stdlib only, as the rest of the shim)
    each second, written to pids.json whenever a new one appears."""

    def __init__(self, launch_dir: str, pids: set[int]):
        self.launch_dir, self.pids, self.written = launch_dir, set(pids), None
        self.lock = threading.Lock()

    def note(self) -> None:
        pgid = os.getpgrp()
        found = set(_group_members(pgid))
        with self.lock:
            self.pids |= found
            if self.pids != self.written:
                _write(self.launch_dir, {"pgid": pgid, "pids": sorted(self.pids), "at": time.time()}, name="pids.json")
                self.written = set(self.pids)

    def watch(self, child: subprocess.Popen) -> None:
        while child.poll() is None:
            try:
                self.note()
            except OSError:
                pass  # a full disk must not end the engine's supervision
            time.sleep(1.0)


def _write(launch_dir: str, record: dict, name: str = "exit.json") -> None:
    path = os.path.join(launch_dir, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(record, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
