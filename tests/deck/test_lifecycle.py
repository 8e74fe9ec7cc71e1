"""The deck on a real llama-server: start, refuse, switch, stop, crash, restore. No orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from servedeck.modelsfile import parse
from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.deck.records import LaunchState
from servedeck.errors import BusyError, LaunchError, RefusedError
from servedeck.supervisor.process import alive, group_members

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def test_start_answers_and_records_launch(deck_config):
    deck = Deck(deck_config)
    rec = deck.start("smol").record  # an alias works like the name
    assert rec.model == "smollm2" and rec.state == LaunchState.READY
    d = Path(rec.launch_dir)
    assert (d / "cmd.sh").read_text().startswith("#!/bin/sh")
    boot = json.loads((d / "boot.json").read_text())
    assert boot["slots"] == 4 and boot["ctx_per_slot"] == 8192  # context is per request; -c = 4 x 8192 (the starter's)
    assert rec.readiness["answered_after_s"] >= rec.readiness["healthy_after_s"]
    r = httpx.post(rec.base_url + "/v1/completions",
                   json={"model": "smollm2", "prompt": "1, 2, 3,", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200
    [st] = [s.to_json() for s in deck.status()]
    assert st["state"] == "ready" and st["pid"] == rec.pid and st["desired"] is True
    assert "smollm2" in S.read_desired()["models"]
    again = deck.start("smollm2")
    assert again.already_running and again.record.pid == rec.pid


def test_refuse_start_into_held_slot_then_switch_and_stop(deck_config):
    deck = Deck(deck_config)
    first = deck.start("smollm2").record
    with pytest.raises(RefusedError) as e:
        deck.start("gemma")
    assert "smollm2" in e.value.message and "switch gemma" in e.value.hint
    second = deck.switch("gemma")
    assert second.evicted == ["smollm2"]
    assert not group_members(first.pgid)  # the holder's whole group is gone
    assert set(S.read_desired()["models"]) == {"gemma"}
    third = deck.switch("smollm2")
    assert third.evicted == ["gemma"] and not group_members(second.record.pgid)
    out = deck.stop(None)
    assert out[0]["model"] == "smollm2" and out[0]["outcome"] == "stopped" and not out[0]["killed"]
    assert not group_members(third.record.pgid)
    assert deck.status() == []
    events = [(r["event"], r["model"], r["outcome"]) for r in S.read_journal()]
    assert ("start", "gemma", "refused") in events and ("switch", "gemma", "ok") in events


def test_engine_that_dies_at_boot_is_reported_at_once(deck_config, tmp_path):
    text = deck_config.path.read_text().replace("args = { parallel = 4 }", "args = { parallel = 4, no-such-flag = true }")
    cfg = parse(text, deck_config.path)
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as e:
        Deck(cfg).start("smollm2")
    took = time.monotonic() - t0
    assert took < 10, f"a dead engine must be reported at once, took {took:.1f}s"
    assert "no-such-flag" in e.value.log_tail
    assert "exited with code" in e.value.message
    last = S.read_journal("smollm2")[-1]
    assert last["outcome"] == "failed" and last["exit"]["returncode"] != 0
    assert S.all_live() == {}
    assert "smollm2" not in S.read_desired()["models"]


def test_kill_9_then_status_tells_the_truth(deck_config):
    deck = Deck(deck_config)
    rec = deck.start("smollm2").record
    engine_pid = rec.engine_pid
    os.kill(engine_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(rec.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    [st] = [s.to_json() for s in deck.status()]
    assert st["state"] == "crashed"
    assert "SIGKILL" in st["detail"]
    [again] = [s.to_json() for s in deck.status()]
    assert again["state"] == "absent" and again["desired"] is True  # wanted, not running, and says why
    assert "crashed" in again["detail"]
    crash = [r for r in S.read_journal("smollm2") if r["event"] == "crash"]
    assert crash and crash[0]["exit"]["signal"] == "SIGKILL"


def test_a_kill_from_outside_the_lock_is_settled_as_a_stop_not_a_crash(deck_config):
    """A campaign's Ctrl-C or cell_timeout stops a cell's engines at once, from outside the thread that may
    hold the deck's lock for a boot: the next holder of the lock settles the record as a stop. Before,
    llama-server's exit 0 on SIGTERM was recorded as a crash ("exited with code 0")."""
    deck = Deck(deck_config)
    rec = deck.start("smollm2").record
    assert deck.kill(["smollm2", "gemma"], reason="campaign t: interrupted (Ctrl-C)") == ["smollm2"]
    assert not group_members(rec.pgid)
    left = S.read_live("smollm2")
    assert left is not None
    assert left.state == LaunchState.STOPPING  # settled by the next holder of the lock
    [st] = [s.to_json() for s in deck.status()]
    assert st["state"] == "stopped", st
    assert S.read_live("smollm2") is None
    rows = S.read_journal("smollm2")
    assert not [r for r in rows if r["event"] == "crash"], rows
    [stop] = [r for r in rows if r["event"] == "stop"]
    assert stop["outcome"] == "stopped"
    assert stop["reason"] == "campaign t: interrupted (Ctrl-C)"
    assert json.loads((Path(rec.launch_dir) / "launch.json").read_text())["state"] == "stopped"


def test_restore_starts_desired_and_adopts_running(deck_config):
    deck = Deck(deck_config)
    rec = deck.start("smollm2").record
    # a "reboot": the engine is gone without a stop, desired state still says it should run
    os.killpg(rec.pgid, signal.SIGKILL)
    while group_members(rec.pgid):
        time.sleep(0.05)
    [r] = deck.restore()
    assert r["outcome"] == "started" and r["pid"] != rec.pid, r
    [r2] = deck.restore()
    assert r2["outcome"] == "adopted" and r2["pid"] == r["pid"]
    assert len([s for s in deck.status() if s.state == "ready"]) == 1


def test_second_caller_gets_a_clear_busy_message(deck_config):
    with S.deck_lock("switch gemma"):
        with pytest.raises(BusyError) as e:
            Deck(deck_config).start("smollm2")
    assert f"pid {os.getpid()} running `switch gemma`" in e.value.message


def test_two_switches_at_once_never_two_engines_in_a_slot(deck_config):
    """Two CLI processes race; one wins, the other is refused clearly (or waits, with --wait)."""
    cmd = [sys.executable, "-m", "servedeck", "--config", str(deck_config.path), "switch"]
    a = subprocess.Popen(cmd + ["smollm2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(cmd + ["gemma"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=120) for p in (a, b)]
    codes = [a.returncode, b.returncode]
    assert sorted(codes) in ([0, 4], [0, 0]), (codes, outs)
    if 4 in codes:
        assert "the deck is busy" in outs[codes.index(4)][1]
    running = [s for s in Deck(deck_config).status() if s.state == "ready"]
    assert len(running) == 1


def test_stop_cli_leaves_no_process(deck_config):
    env = dict(os.environ)
    base = [sys.executable, "-m", "servedeck", "--config", str(deck_config.path)]
    r = subprocess.run(base + ["start", "smollm2"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    pgid = S.read_live("smollm2").pgid
    r = subprocess.run(base + ["status", "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)[0]["state"] == "ready"
    r = subprocess.run(base + ["stop", "--all"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "stopped" in r.stdout
    assert not group_members(pgid)


def test_a_crash_is_classified_among_its_own_engines_signatures(deck_config, tmp_path):
    """Defect: the deck called `classify` without the engine, so a vLLM-only signature could label a
    llama.cpp crash. Here llama-server fails to open a model whose path reads like vLLM's start-up
    out-of-memory line; the cause must be llama.cpp's load failure, not vLLM's signature."""
    odd = tmp_path / "Free memory on device 0 is less than desired GPU memory utilization" / "m.gguf"
    text = deck_config.path.read_text().replace(f'source = "{deck_config.models["smollm2"].source}"',
                                                f'source = "{odd}"', 1)
    cfg = parse(text, deck_config.path)
    with pytest.raises(LaunchError) as e:
        Deck(cfg).start("smollm2")
    assert "less than desired GPU memory" in e.value.log_tail  # the vLLM-looking line is in the log
    assert e.value.cause["id"] == "llamacpp-load-failed", e.value.cause
    assert all(ev["id"] != "vllm-free-memory-below-utilization" for ev in e.value.cause["evidence"])
