"""servedeck itself SIGKILLed in the middle of `switch`: the next command finds a consistent state,
no orphaned engine, no duplicate. (Two switches at once: tests/deck/test_lifecycle.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.supervisor.process import group_members
from servedeck.watch import Watcher
from watchkit import kinds, wait_for, with_host

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def _cli(cfg, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg.path), *args],
                          capture_output=True, text=True, timeout=timeout)


def _kill_switch_mid_start(cfg):
    """Start smollm2, then SIGKILL `servedeck switch gemma` once gemma's engine is spawned but not ready."""
    first = Deck(cfg).start("smollm2").record
    p = subprocess.Popen([sys.executable, "-m", "servedeck", "--config", str(cfg.path), "switch", "gemma"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the record is written just before the spawn (pid None), then again with the shim's pid: wait for that
    orphan = wait_for(lambda: (r := S.read_live("gemma")) and r.pid and r, 60, step=0.01,
                      what="gemma's live record with its shim's pid")
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    assert not group_members(first.pgid)  # the eviction had finished
    return orphan


@pytest.mark.parametrize("next_command", ["status-then-switch", "watch"])
def test_switch_killed_mid_start_leaves_a_consistent_state(deck_config, next_command):
    cfg = with_host(deck_config, liveness_interval_s=60.0)
    orphan = _kill_switch_mid_start(cfg)
    assert group_members(orphan.pgid)  # its engine outlived the killed switch (its own session)
    if next_command == "status-then-switch":
        r = _cli(cfg, "status", "--json")
        [row] = json.loads(r.stdout)
        # reality and desired state disagree, and status says so
        assert row["model"] == "gemma" and row["desired"] is False
        assert row["state"] == "starting" and "is gone" in row["detail"]
        r = _cli(cfg, "switch", "gemma")
        assert r.returncode == 0, r.stderr
        assert not group_members(orphan.pgid)  # the orphan was reaped, not adopted half-started
        ready = [s for s in Deck(cfg).status() if s.state == "ready"]
        assert [s.model for s in ready] == ["gemma"] and ready[0].record.pid != orphan.pid
        assert set(S.read_desired()["models"]) == {"gemma"}
        assert any(r["outcome"] == "orphan-reaped" for r in S.read_journal("gemma"))
    else:
        Watcher(cfg, interval_s=0.1).tick()
        assert "reaped" in kinds("gemma")
        assert not group_members(orphan.pgid) and S.all_live() == {}
        # desired state is empty (smollm2 was evicted, gemma never became ready) and so is reality
        assert S.read_desired()["models"] == {} and Deck(cfg).status() == []
