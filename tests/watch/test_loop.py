"""The watch loop on a real llama-server: relaunch with notices, give up with evidence, adopt and
reap after a restart, refuse a corrupt desired.json. The stall report runs on a timing instrument
(stall_instrument.py: it answers readiness, then no completion), not on llama-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from servedeck import paths
from servedeck.fsio import read_holder
from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.deck.deck import settings_of
from servedeck.errors import BusyError, StateError
from servedeck.supervisor.process import alive, group_members
from servedeck.watch import Watcher, read_notices
from watchkit import SECRET, add_instrument, edit, free_port, kinds, wait_for, with_host

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def test_sigkilled_engine_is_relaunched_with_a_notice(deck_config):
    cfg = with_host(deck_config, relaunch_spacing_s=0.5, liveness_interval_s=60.0)
    deck = Deck(cfg)
    rec = deck.start("smollm2").record
    w = Watcher(cfg, interval_s=0.2)
    w.tick()
    assert kinds() == ["adopted"]  # started outside the loop: adopted, not started again
    os.kill(rec.engine_pid, signal.SIGKILL)
    wait_for(lambda: not alive(rec.pid), 10, what="the shim to end")
    told: list[str] = []
    done = threading.Event()
    second = threading.Thread(target=_stop_during_the_relaunch, args=(done, told))
    second.start()
    try:
        w.tick()
    finally:
        done.set()
        second.join(30)
    # a command typed during the relaunch's boot is told what holds the deck, at once, not made to wait
    assert len(told) == 1 and "running `watch: relaunch 1/3 of smollm2`" in told[0], told
    assert kinds() == ["adopted", "crashed", "relaunch", "relaunched"]
    crashed, relaunch = read_notices()[1:3]
    assert "SIGKILL" in crashed["message"] and relaunch["message"].startswith("relaunch 1/3 of smollm2: killed by SIGKILL")
    [st] = [s.to_json() for s in deck.status()]
    assert st["state"] == "ready" and st["pid"] != rec.pid
    assert not group_members(rec.pgid)
    w.tick()  # nothing more to do: no duplicate
    assert len([s for s in deck.status() if s.state == "ready"]) == 1 and kinds()[-1] == "relaunched"


def _stop_during_the_relaunch(done: threading.Event, told: list[str]) -> None:
    """Once the loop's pass says on the lock that it relaunches, try the deck lock as `stop --all` would."""
    while not done.is_set():
        holder = read_holder(paths.lock_file()) or {}
        if str(holder.get("what", "")).startswith("watch: relaunch"):
            try:
                with S.deck_lock("stop --all"):
                    told.append("the lock was free")
            except BusyError as e:
                told.append(e.message)
            return
        time.sleep(0.01)


def test_engine_that_crashes_on_every_boot_gets_n_tries_then_gives_up(deck_config, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    cfg = with_host(deck_config, relaunch_tries=3, relaunch_spacing_s=1.0, liveness_interval_s=60.0)
    bad = edit(cfg, "args = { parallel = 4 }", "args = { parallel = 4, no-such-flag = true }\nenv = { HF_TOKEN = \"%s\" }" % SECRET)
    S.set_desired("smollm2", settings_of("smollm2", bad))  # desired state replays these settings
    w = Watcher(cfg, interval_s=0.2)
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop,))
    t0 = time.monotonic()
    t.start()
    try:
        wait_for(lambda: "gave-up" in kinds(), 60, what="the loop to give up")
        time.sleep(2.5)  # more than the spacing: a busy loop would try again here
    finally:
        stop.set()
        t.join(30)
    took = time.monotonic() - t0
    rows = read_notices(model="smollm2")
    relaunches = [r for r in rows if r["kind"] == "relaunch"]
    assert [r["message"].split(":")[0] for r in relaunches] == [f"relaunch {i}/3 of smollm2" for i in (1, 2, 3)]
    assert len([r for r in rows if r["kind"] == "relaunch-failed"]) == 3
    assert len(list((paths.launches_dir() / "smollm2").iterdir())) == 3  # exactly N launches, then none
    gaps = [b["t"] - a["t"] for a, b in zip(relaunches, relaunches[1:])]
    assert all(g >= 1.0 for g in gaps), gaps  # spaced, never a busy loop
    assert took < 40
    [st] = [s.to_json() for s in Deck(cfg).status()]
    assert st["state"] == "gave-up" and "gave up after 3 relaunch tries" in st["detail"]
    assert len(st["evidence"]) == 3 and all("no-such-flag" in "\n".join(e["log_tail"]) for e in st["evidence"])
    assert any(r["event"] == "watch" and r["outcome"] == "gave-up" for r in S.read_journal("smollm2"))
    # a restarted loop remembers it gave up: no new tries
    Watcher(cfg, interval_s=0.2).tick()
    assert len(list((paths.launches_dir() / "smollm2").iterdir())) == 3
    for f in (paths.notices_file(), S.watch_file()):
        assert SECRET not in f.read_text()


def _watch(cfg, home: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "servedeck", "--config", str(cfg.path), "watch", "--interval", "0.3s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_restarted_loop_adopts_what_is_wanted_and_reaps_what_is_not(deck_config, servedeck_home):
    cfg = with_host(deck_config, liveness_interval_s=60.0)
    cfg = edit(cfg, 'slot = "main"\naliases = ["gemma3-270m"]', 'slot = "side"\naliases = ["gemma3-270m"]')
    deck = Deck(cfg)
    keep = deck.start("smollm2").record
    unwanted = deck.start("gemma").record
    S.set_desired("gemma", None)  # nothing wants it any more (as if a stop was killed half-way)
    first = _watch(cfg, servedeck_home)
    try:
        wait_for(lambda: {"adopted", "reaped"} <= set(kinds()), 30, what="adopt + reap")
        assert not group_members(unwanted.pgid)
        first.send_signal(signal.SIGKILL)  # the loop itself dies; its engines do not
        first.wait(10)
        assert alive(keep.pid)
        second = _watch(cfg, servedeck_home)
        try:
            wait_for(lambda: kinds().count("adopted") == 2, 30, what="the second loop to adopt")
            third = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg.path), "watch"],
                                   capture_output=True, text=True, timeout=60)
            assert third.returncode == 4 and "already watches" in third.stderr  # one loop per state dir
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(20)
    finally:
        if first.poll() is None:
            first.kill()
    assert len(list((paths.launches_dir() / "smollm2").iterdir())) == 1  # adopted, never started twice
    assert [s.model for s in deck.status() if s.state == "ready"] == ["smollm2"]
    assert "stopped" in kinds()


def test_corrupt_desired_json_is_an_error_naming_the_file_and_nothing_starts(deck_config):
    cfg = with_host(deck_config, liveness_interval_s=60.0)
    S.set_desired("smollm2", settings_of("smollm2", cfg))
    S.set_desired("smollm2", settings_of("smollm2", cfg))  # now a .bak exists
    bak = paths.desired_file().with_suffix(".json.bak")
    good = bak.read_text()
    paths.desired_file().write_text(paths.desired_file().read_text()[:40])  # truncated mid-write
    w = Watcher(cfg, interval_s=0.1)
    with pytest.raises(StateError) as e:
        w.tick()
    assert str(paths.desired_file()) in e.value.message and str(bak) in e.value.hint
    w.run(max_ticks=3)
    errors = [n for n in read_notices() if n["kind"] == "error"]
    assert len(errors) == 1 and str(paths.desired_file()) in errors[0]["message"]  # once, not per tick
    assert not paths.launches_dir().exists() and S.all_live() == {}
    assert bak.read_text() == good


@pytest.mark.parametrize("moving", [False, True])
def test_a_stalled_instrument_is_reported_within_the_configured_time(deck_config, tmp_path, moving):
    """On stall_instrument.py, whose counters freeze (stalled) or grow without our request (slow)."""
    cfg = with_host(deck_config, liveness_interval_s=1.0, stall_after_s=2.0)
    cfg = add_instrument(cfg, tmp_path, free_port(), *(["--moving"] if moving else []))
    rec = Deck(cfg).start("stuck").record  # answers the readiness completion, then never another
    w = Watcher(cfg, interval_s=0.2)
    t0 = time.monotonic()
    verdict = "slow" if moving else "stalled"
    wait_for(lambda: (w.tick(), verdict in kinds("stuck"))[1], 10, what=verdict)
    assert time.monotonic() - t0 <= 1.0 + 2.0 + 3.0  # interval + stall_after_s + a probe's slack
    n = [r for r in read_notices(model="stuck") if r["kind"] == verdict][0]
    assert "generation_tokens" in n["counters"] and n["counters"]["running"] == 1
    assert ("+" in n["message"]) if moving else ("did not move" in n["message"])
    [st] = [s.to_json() for s in Deck(cfg).status()]
    assert st["state"] == verdict and st["liveness"]["counters"]
    assert alive(rec.pid)  # reported, not killed: the evidence stays


class SteppedWallClock:
    """The `time` module as watch/loop.py sees it, with the wall clock stepped by `step_s` (as NTP or
    an admin's `date -s` would) and the monotonic clock left as it is."""

    def __init__(self, step_s: float):
        self.step_s = step_s

    def time(self) -> float:
        return time.time() + self.step_s

    def monotonic(self) -> float:
        return time.monotonic()


def _failing_boot(deck_config, spacing_s: float):
    cfg = with_host(deck_config, relaunch_tries=3, relaunch_spacing_s=spacing_s, liveness_interval_s=60.0)
    bad = edit(cfg, "args = { parallel = 4 }", "args = { parallel = 4, no-such-flag = true }")
    S.set_desired("smollm2", settings_of("smollm2", bad))  # every boot of it fails at once
    return cfg


def test_a_wall_clock_step_forward_does_not_hurry_the_next_relaunch(deck_config, monkeypatch):
    import servedeck.watch.loop as loop

    w = Watcher(_failing_boot(deck_config, spacing_s=30.0), interval_s=0.2)
    w.tick()  # relaunch 1/3 fails: the next is 30 s away
    monkeypatch.setattr(loop, "time", SteppedWallClock(+3600.0))
    w.tick()
    assert kinds("smollm2").count("relaunch") == 1


def test_a_wall_clock_step_back_does_not_delay_the_next_relaunch(deck_config, monkeypatch):
    import servedeck.watch.loop as loop

    w = Watcher(_failing_boot(deck_config, spacing_s=0.5), interval_s=0.2)
    w.tick()  # relaunch 1/3 fails: the next is 0.5 s away
    monkeypatch.setattr(loop, "time", SteppedWallClock(-3600.0))
    time.sleep(0.6)
    w.tick()
    assert kinds("smollm2").count("relaunch") == 2
