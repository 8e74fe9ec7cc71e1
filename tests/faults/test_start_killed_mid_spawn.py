"""servedeck SIGKILLed inside a start, at the points where no timing race is needed to hit it: the next
servedeck must find what it left and reap it, never leave an engine running that nobody records.

The kill is made deterministic by running the start in a child Python whose `process.spawn` is wrapped
to SIGKILL (or SIGSTOP) the child itself right before or right after the real spawn. Seen in the
campaign matrix once in 4 runs: the shim and engine outlived a servedeck killed between spawn and
its live record, held the port, and every later start was refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from servedeck import paths
from servedeck.deck import state as S
from servedeck.supervisor.process import port_holder
from servedeck.watch import Watcher
from procgroups import NotedGroups
from watchkit import wait_for

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

# Runs `servedeck --config CFG start smollm2` with spawn wrapped: WHEN is "after-spawn" or
# "before-spawn", SIGNAL the signal the child sends itself there.
CHILD = textwrap.dedent("""
    import os, runpy, signal, sys
    from servedeck.supervisor import process as P
    when, sig, cfg = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3]
    real = P.spawn
    def spawn(spec, launch_dir):
        if when == "before-spawn":
            os.kill(os.getpid(), sig)
        proc = real(spec, launch_dir)
        if when == "after-spawn":
            os.kill(os.getpid(), sig)
        return proc
    P.spawn = spawn
    sys.argv = ["servedeck", "--config", cfg, "start", "smollm2"]
    runpy.run_module("servedeck", run_name="__main__")
""")


def start_child(cfg, when: str, sig: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, when, sig, str(cfg.path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def shims_of(launch_dir: Path) -> list[psutil.Process]:
    """The shim processes whose argv names this launch folder (found here without the deck's help)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if "servedeck.supervisor.shim" in cmd and str(launch_dir) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def only_launch() -> Path:
    [d] = list((paths.launches_dir() / "smollm2").iterdir())
    return d


def servedeck(cfg, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg.path), *args],
                          capture_output=True, text=True, timeout=180)


@pytest.fixture
def groups():
    """Process groups the test started or found: stopped at the end whatever the deck did."""
    found = NotedGroups()  # by number and start time: a killed shim's number may be another's by the end
    yield found
    found.stop_all(5)


def _killed_after_spawn(cfg, groups) -> tuple[Path, int]:
    child = start_child(cfg, "after-spawn", "SIGKILL")
    assert child.wait(120) == -signal.SIGKILL, child.stderr.read()[-2000:]
    d = only_launch()
    shims = shims_of(d)
    groups.extend(os.getpgid(p.pid) for p in shims)
    assert len(shims) == 1  # the case under test: the shim outlived the servedeck that spawned it
    return d, shims[0].pid


def test_a_start_killed_right_after_spawn_is_reaped_by_the_next_start(deck_config, groups):
    d, shim = _killed_after_spawn(deck_config, groups)
    port = deck_config.models["smollm2"].port
    r = servedeck(deck_config, "start", "smollm2")
    assert r.returncode == 0, r.stderr[-2000:]
    new = S.read_live("smollm2")
    groups.append(new.pgid)
    assert not groups.members(0)  # the old shim's group (shim and engine) is gone
    assert new.pid != shim
    assert port_holder(port)["pgid"] == new.pgid  # the port went to the new engine
    old = json.loads((d / "launch.json").read_text())
    assert old["state"] == "failed"
    assert "orphaned" in old["end_detail"]
    reaped = [j for j in S.read_journal("smollm2") if j["outcome"] == "orphan-reaped"]
    assert [j["launch_dir"] for j in reaped] == [str(d)]


def test_a_start_killed_right_after_spawn_is_reaped_by_the_watch_loop(deck_config, groups):
    d, shim = _killed_after_spawn(deck_config, groups)
    Watcher(deck_config, interval_s=0.1).tick()
    assert not groups.members(0)
    assert S.all_live() == {}
    assert port_holder(deck_config.models["smollm2"].port) is None
    reaped = [j for j in S.read_journal("smollm2") if j["outcome"] == "orphan-reaped"]
    assert [j["launch_dir"] for j in reaped] == [str(d)]


def test_a_start_paused_after_spawn_shows_starting_with_its_shim(deck_config, groups):
    """A start still under way (its servedeck alive, only stopped) is starting, never settled as dead."""
    child = start_child(deck_config, "after-spawn", "SIGSTOP")
    try:
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_STOPPED, 120, 0.05, "the child to stop")
        d = only_launch()
        shims = shims_of(d)
        groups.extend(os.getpgid(p.pid) for p in shims)
        assert len(shims) == 1
        [row] = json.loads(servedeck(deck_config, "status", "--json").stdout)
        assert row["state"] == "starting"
        assert row["pid"] == shims[0].pid
        assert S.read_live("smollm2") is not None  # not settled
    finally:
        child.kill()
        child.wait(30)


def test_a_start_paused_before_spawn_is_starting_then_settled_once_its_servedeck_is_killed(deck_config, groups):
    child = start_child(deck_config, "before-spawn", "SIGSTOP")
    try:
        wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_STOPPED, 120, 0.05, "the child to stop")
        [row] = json.loads(servedeck(deck_config, "status", "--json").stdout)
        assert row["state"] == "starting"
    finally:
        child.kill()
        child.wait(30)
    d = only_launch()
    assert shims_of(d) == []  # nothing was spawned
    r = servedeck(deck_config, "start", "smollm2")
    assert r.returncode == 0, r.stderr[-2000:]
    groups.append(S.read_live("smollm2").pgid)
    old = json.loads((d / "launch.json").read_text())
    assert old["state"] == "failed"
    assert "before its engine was spawned" in old["end_detail"]


def test_a_ctrl_c_right_after_spawn_stops_the_shim_it_spawned(deck_config, groups, monkeypatch):
    from servedeck.deck import Deck
    from servedeck.supervisor import process as P

    real = P.spawn

    def spawn_then_ctrl_c(spec, launch_dir):
        proc = real(spec, launch_dir)
        groups.append(proc.pgid)
        raise KeyboardInterrupt

    monkeypatch.setattr(P, "spawn", spawn_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        Deck(deck_config).start("smollm2")
    assert not groups.members(0)
    assert S.all_live() == {}
    assert json.loads((only_launch() / "launch.json").read_text())["state"] == "failed"


def test_a_spawn_that_raises_leaves_no_live_record_and_its_launch_failed(deck_config, monkeypatch):
    from servedeck.deck import Deck
    from servedeck.supervisor import process as P

    def cannot_spawn(spec, launch_dir):
        raise PermissionError(13, "Permission denied", "/no/python")

    monkeypatch.setattr(P, "spawn", cannot_spawn)
    with pytest.raises(PermissionError):
        Deck(deck_config).start("smollm2")
    assert S.all_live() == {}
    launch = json.loads((only_launch() / "launch.json").read_text())
    assert launch["state"] == "failed"
    assert "Permission denied" in launch["end_detail"]
