"""Spawning an engine in its own process group, knowing whether it lives, and stopping it properly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from servedeck.engines.base import LaunchSpec


@dataclass(frozen=True)
class Proc:
    """A process servedeck started: pid of the shim (= the group id) and its start time, which
    together identify it even after the pid number is reused."""

    pid: int
    create_time: float

    @property
    def pgid(self) -> int:
        return self.pid


# a campaign cell on a Ray node sets this to its worker's pid: the shim stops the engine if that process dies
ENGINE_OWNER_ENV = "SERVEDECK_ENGINE_OWNER"
SHIM_MODULE = "servedeck.supervisor.shim"  # its argv names the launch folder: `find_shim` relies on that
# servedeck's own secrets, never an engine's: the door's api key (door/serve.py), exported for `serve`
NOT_INHERITED = ("SERVEDECK_API_KEY",)


def spawn(spec: LaunchSpec, launch_dir: Path) -> Proc:
    """Start the shim (servedeck's own interpreter, in servedeck's own environment) in a new session; it
    starts the engine with the launch's environment on top of that. The two differ on purpose: a build
    whose `env` sets PYTHONPATH (a vLLM unpacked with `pip --target`) must not take servedeck away from
    its own supervisor. The engine's variables reach the shim on its stdin, so no file holds them."""
    log = open(launch_dir / "engine.log", "ab", buffering=0)
    try:
        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        env.setdefault("PYTHONUNBUFFERED", "1")
        p = subprocess.Popen(
            [sys.executable, "-m", SHIM_MODULE, "--env-stdin",
             *(["--cpus", ",".join(str(c) for c in spec.cpus)] if spec.cpus else []),
             # a campaign cell on a Ray node: the engine goes with the worker that launched it (cluster/node.py)
             *(["--owner", os.environ[ENGINE_OWNER_ENV]] if os.environ.get(ENGINE_OWNER_ENV) else []),
             str(launch_dir), "--",
             *spec.argv],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
            start_new_session=True, env=env, close_fds=True,
        )
    finally:
        log.close()
    try:
        assert p.stdin is not None
        p.stdin.write(json.dumps(engine_env(spec)).encode())
        p.stdin.close()
    except OSError:  # the shim is already gone (it could not start): its log and exit say why
        pass
    return Proc(pid=p.pid, create_time=psutil.Process(p.pid).create_time())


def engine_env(spec: LaunchSpec) -> dict[str, str]:
    """What the shim adds to its own environment for the engine: the launch's env, unbuffered output."""
    return {"PYTHONUNBUFFERED": "1", **spec.env}


def find_shim(launch_dir: str | Path) -> Proc | None:
    """The running shim of a launch folder, found by its argv (`... shim [opts] LAUNCH_DIR -- ARGV`):
    how a launch whose spawner died before recording the pid is still found. None when none runs."""
    want = str(launch_dir)
    for p in psutil.process_iter(["cmdline", "status", "create_time"]):
        cmd = p.info["cmdline"] or []
        if SHIM_MODULE not in cmd or "--" not in cmd or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if cmd[cmd.index("--") - 1] == want:
            return Proc(pid=p.pid, create_time=p.info["create_time"])
    return None


def start_time_of(pid: int) -> float | None:
    """When process `pid` started (with the pid, what tells it from a later process given the number)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _reap(pid: int | None) -> None:
    if not pid:  # a record written before its spawn has no pid yet
        return
    try:  # if we are the parent (tests, the watch loop), collect the zombie
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def alive(pid: int | None, create_time: float | None = None) -> bool:
    if not pid:  # never psutil.Process(None): that is this process
        return False
    _reap(pid)
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.05:
            return False  # the pid was reused by an unrelated process
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int | None) -> list[int]:
    out: list[int] = []
    if not pgid:
        return out
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def left_in_group(pgid: int | None, leader_create_time: float | None) -> list[int]:
    """The processes still in the group of a leader (a shim) that is gone: an engine its killed shim left
    running. Empty while the leader lives, and whenever the group may not be the one that leader led:
    its pid now names another process (the number was reused), a member is older than the leader was
    (the leader cannot have started it), or the leader's start time was never recorded."""
    if leader_create_time is None or not pgid:
        return []
    _reap(pgid)
    try:
        leader = psutil.Process(pgid)
        if abs(leader.create_time() - leader_create_time) > 0.05 or leader.status() != psutil.STATUS_ZOMBIE:
            return []  # another process has the number, or the leader itself still runs
    except psutil.NoSuchProcess:
        pass
    members = []
    for pid in group_members(pgid):
        try:
            if psutil.Process(pid).create_time() < leader_create_time - 0.05:
                return []
        except psutil.NoSuchProcess:
            continue
        members.append(pid)
    return members


def group_is_ours(pgid: int | None, leader_create_time: float | None) -> bool:
    """Whether process group `pgid` is still the one its leader (a shim, started at `leader_create_time`)
    led. Not when its number now names a process started at another time: the group ended and the kernel
    gave the number to a new process, which may lead a group of its own (another engine's shim: a busy
    machine goes through pid_max's 32,768 numbers in minutes). While the leader is gone but members remain,
    the number cannot be given to another process, so they are its. No start time recorded: the number
    is all there is to go by."""
    if not pgid:
        return False
    if leader_create_time is None:
        return True
    try:
        return abs(psutil.Process(pgid).create_time() - leader_create_time) <= 0.05
    except psutil.NoSuchProcess:
        return True


def members_if_ours(pgid: int | None, leader_create_time: float | None) -> list[int]:
    """The group's live members while it is the group its leader led (`group_is_ours`); else none."""
    return group_members(pgid) if group_is_ours(pgid, leader_create_time) else []


def stop_group(pgid: int | None, grace_s: float, poll_s: float = 0.1,
               leader_create_time: float | None = None) -> dict:
    """SIGTERM to the whole group, wait up to `grace_s`, then SIGKILL to the group. Returns what happened.
    With `leader_create_time` (a record's shim), a group whose number now names another process is never
    signalled, before the first signal or between them (`group_is_ours`): stopping a stale record must not
    stop a stranger's engine."""
    t0 = time.monotonic()

    def ours() -> list[int]:
        return members_if_ours(pgid, leader_create_time)

    if not ours():
        _reap(pgid)
        return {"already_gone": True, "killed": False, "took_s": 0.0}
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    killed = False
    while ours():
        _reap(pgid)
        if time.monotonic() - t0 > grace_s:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed = True
            deadline = time.monotonic() + 10
            while ours() and time.monotonic() < deadline:
                _reap(pgid)
                time.sleep(poll_s)
            break
        time.sleep(poll_s)
    _reap(pgid)
    return {"already_gone": False, "killed": killed, "took_s": round(time.monotonic() - t0, 3),
            "left": ours()}


def port_holder(port: int, host: str = "127.0.0.1") -> dict | None:
    """Who listens on this TCP port, if anyone: {pid, name, cmdline}. pid None when we may not see it."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # pragma: no cover - we run as the user who owns the engines
        conns = []
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            info: dict = {"pid": c.pid, "address": f"{c.laddr.ip}:{c.laddr.port}"}
            if c.pid:
                try:
                    p = psutil.Process(c.pid)
                    info.update(name=p.name(), cmdline=" ".join(p.cmdline())[:200], pgid=os.getpgid(c.pid))
                except (psutil.Error, ProcessLookupError):
                    pass
            return info
    return None


def wait_port_free(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while port_holder(port) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
