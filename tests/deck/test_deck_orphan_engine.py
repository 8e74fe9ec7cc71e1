"""Issue 20 item 4 on a real llama-server: the supervisor shim SIGKILLed (the OOM killer may pick it)
leaves its engine running, unsupervised, on the model's port. The deck must stop that engine (its
process group) in every case: `stop MODEL`, `stop --all`, and before starting the model again; and
`status` must say what runs. A pid number the kernel gave to another process is never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from servedeck import paths
from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.supervisor.process import alive, members_if_ours, port_holder

from procgroups import NotedGroups

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


@pytest.fixture
def groups():
    """Process groups a test started: stopped at the end whatever the deck did (an engine left by a
    killed shim has no live record, so the root conftest's clean-up cannot find it)."""
    started = NotedGroups()  # by number and start time: a killed shim's number may be another's by the end
    yield started
    started.stop_all(5)


def kill_shim(rec: LiveRecord) -> None:
    os.kill(rec.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(rec.pid, rec.create_time) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(rec.pid, rec.create_time), "the shim outlived SIGKILL"
    assert alive(rec.engine_pid), "the engine should outlive its shim (the case under test)"


def servedeck(cfg, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg.path), *args],
                          capture_output=True, text=True, timeout=180)


def test_stop_stops_the_engine_a_killed_shim_left_and_frees_its_port(deck_config, groups):
    rec = Deck(deck_config).start("smollm2").record
    groups.append(rec.pgid)
    kill_shim(rec)
    r = servedeck(deck_config, "stop", "smollm2")
    assert r.returncode == 0, r.stderr
    assert not alive(rec.engine_pid)
    assert not members_if_ours(rec.pgid, rec.create_time)
    assert port_holder(rec.port) is None
    assert "smollm2" not in S.read_desired()["models"]
    assert f"pid {rec.engine_pid}" in r.stdout  # says which process it stopped


def test_stop_all_stops_the_engine_a_killed_shim_left(deck_config, groups):
    rec = Deck(deck_config).start("smollm2").record
    groups.append(rec.pgid)
    kill_shim(rec)
    r = servedeck(deck_config, "stop", "--all")
    assert r.returncode == 0, r.stderr
    assert not members_if_ours(rec.pgid, rec.create_time)
    assert port_holder(rec.port) is None


def test_status_shows_an_engine_without_its_shim_as_orphaned_and_leaves_it(deck_config, groups):
    rec = Deck(deck_config).start("smollm2").record
    groups.append(rec.pgid)
    kill_shim(rec)
    r = servedeck(deck_config, "status", "--json")
    [row] = json.loads(r.stdout)
    assert row["state"] == "orphaned"
    assert f"pid {rec.engine_pid}" in row["detail"]
    assert alive(rec.engine_pid)  # status is a query: it does not stop a serving engine


def test_start_again_stops_the_left_engine_then_starts_under_a_new_shim(deck_config, groups):
    deck = Deck(deck_config)
    rec = deck.start("smollm2").record
    groups.append(rec.pgid)
    kill_shim(rec)
    new = deck.start("smollm2").record
    groups.append(new.pgid)
    assert new.state == LaunchState.READY
    assert new.pid != rec.pid
    assert not alive(rec.engine_pid)
    crash = [j for j in S.read_journal("smollm2") if j["event"] == "crash"][-1]
    assert f"pid {rec.engine_pid}" in crash["detail"]


def test_a_reused_pid_is_never_taken_for_the_shims_group(deck_config, groups):
    """A live record whose shim pid now names another process (its create time differs): the deck
    must not signal that process's group, though the pid and group id match the record."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    groups.append(other.pid)
    born = psutil.Process(other.pid).create_time()
    gone = paths.launches_dir() / "smollm2" / "gone"
    gone.mkdir(parents=True)
    S.write_live(LiveRecord(model="smollm2", engine="llamacpp", build="llamacpp", slot="main", port=1,
                            launch_dir=str(gone), pid=other.pid,
                            pgid=other.pid, create_time=born - 30.0, owner_pid=1, state=LaunchState.READY,
                            engine_pid=other.pid))
    Deck(deck_config).stop(["smollm2"])
    assert other.poll() is None  # still running
    other.kill()
    other.wait()


def test_start_foreground_whose_shim_is_killed_exits_as_a_failure_and_leaves_no_engine(deck_config, groups):
    """What a systemd unit runs: its shim killed, it exits non-zero (Restart=on-failure restarts it)
    and stops the engine first, so the restarted unit finds the port free."""
    fg = subprocess.Popen([sys.executable, "-m", "servedeck", "--config", str(deck_config.path), "start", "smollm2",
                           "--foreground"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        rec = None
        while time.monotonic() < deadline and fg.poll() is None:
            rec = S.read_live("smollm2")
            if rec and rec.state == LaunchState.READY:
                break
            time.sleep(0.2)
        assert rec is not None and rec.state == LaunchState.READY, "start --foreground did not get smollm2 ready"
        groups.append(rec.pgid)
        kill_shim(rec)
        assert fg.wait(60) == 1
        assert not alive(rec.engine_pid)
        assert port_holder(rec.port) is None
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait()
