"""Sleep in the deck, on real llama-server engines (SmolLM2 and Gemma, one slot). llama.cpp cannot sleep:
a switch stops it cold and says so, `servedeck sleep` refuses. The bookkeeping of a sleeping launch
(status, slots, stop, a death while asleep, restore, a wake that fails) is exercised on a llama-server
whose live record the test sets to `asleep` by hand, as the deck writes it before it tells an engine to
sleep: the engine is real, only its sleep is not (no engine that sleeps runs on these machines; the GPU
bench, bench/sleep_switch.py, runs the real thing on vLLM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.deck.records import LaunchState
from servedeck.errors import RefusedError
from servedeck.modelsfile import load
from servedeck.supervisor.process import alive, group_members

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

GiB = 2**30
CANNOT = "cannot sleep: engine 'llamacpp' has no sleep mode"


@pytest.fixture
def sleepy(deck_config):
    """The starter models.toml with sleep = "auto" on both llama.cpp models of slot main."""
    text = deck_config.path.read_text()
    for name in ("smollm2", "gemma"):
        text = text.replace(f"[models.{name}]\n", f'[models.{name}]\nsleep = "auto"\n')
    deck_config.path.write_text(text)
    return load(deck_config.path)


def servedeck(cfg, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg.path), *args],
                          capture_output=True, text=True, timeout=180)


def mark_asleep(name: str, level: int = 1, host_bytes: int = 15 * GiB) -> None:
    """What the deck writes just before it tells an engine to sleep (deck/sleep.py put_to_sleep)."""
    rec = S.read_live(name)
    rec.state, rec.sleep_level, rec.asleep_since, rec.asleep_host_bytes = LaunchState.ASLEEP, level, time.time(), host_bytes
    rec.spec = {**rec.spec, "sleep_levels": [1, 2]}
    S.write_live(rec)


def test_a_switch_from_a_model_that_cannot_sleep_stops_it_cold_and_says_so(sleepy):
    deck = Deck(sleepy)
    first = deck.start("smollm2").record
    words: list[str] = []
    res = deck.switch("gemma", on_step=words.append)
    assert res.evicted == ["smollm2"] and res.slept == {}
    assert res.stopped_cold == {"smollm2": f"smollm2 {CANNOT}"}
    assert words == [f"switch (cold: smollm2 {CANNOT})"]  # what the door's x-servedeck-waited says
    assert not group_members(first.pgid)
    ok = [r for r in S.read_journal("gemma") if r["event"] == "switch" and r["outcome"] == "ok"][-1]
    assert ok["stopped_cold"] == {"smollm2": f"smollm2 {CANNOT}"} and ok["slept"] == {}
    stop = [r for r in S.read_journal("smollm2") if r["event"] == "stop"][-1]
    assert CANNOT in stop["reason"]
    r = servedeck(sleepy, "switch", "smollm2")
    assert r.returncode == 0, r.stderr
    assert f"gemma stopped cold: gemma {CANNOT}" in r.stdout and "evicted gemma" in r.stdout


def test_an_entry_that_does_not_ask_to_sleep_switches_as_before(deck_config):
    deck = Deck(deck_config)
    deck.start("smollm2")
    words: list[str] = []
    res = deck.switch("gemma", on_step=words.append)
    assert res.evicted == ["smollm2"] and res.stopped_cold == {} and words == ["switch"]


def test_servedeck_sleep_refuses_a_model_that_cannot_sleep_and_it_keeps_serving(sleepy):
    deck = Deck(sleepy)
    rec = deck.start("smollm2").record
    r = servedeck(sleepy, "sleep", "smollm2")
    assert r.returncode == 5 and "Traceback" not in r.stderr
    assert "cannot put smollm2 to sleep: engine 'llamacpp' has no sleep mode" in r.stdout + r.stderr
    assert "servedeck stop smollm2" in r.stdout + r.stderr
    r = servedeck(sleepy, "wake", "smollm2")
    assert r.returncode == 5 and "cannot wake smollm2: it is ready, not asleep" in r.stdout + r.stderr
    [st] = [s.to_json() for s in deck.status()]
    assert st["state"] == "ready" and st["pid"] == rec.pid


def test_a_sleeping_launch_in_status_holds_no_slot_and_stop_stops_it(sleepy):
    """Its record set asleep (level 1, 15 GiB pinned): status names it and what frees it; gemma starts
    in the same slot without a switch (a sleeping model holds none); `stop` ends it by its group."""
    deck = Deck(sleepy)
    rec = deck.start("smollm2").record
    mark_asleep("smollm2")
    st = {s.model: s.to_json() for s in deck.status()}["smollm2"]
    assert st["state"] == "asleep" and st["sleep_level"] == 1 and st["asleep_host_bytes"] == 15 * GiB
    assert "asleep at level 1; holds GPU memory not measured here (no GPU) and 15.0 GiB of pinned host memory" in st["detail"]
    assert "`servedeck stop smollm2` frees it" in st["detail"]
    gemma = deck.start("gemma").record  # no RefusedError: the slot is free of awake models
    assert gemma.state == LaunchState.READY and alive(rec.pid)
    out = deck.stop(["smollm2"])
    assert out[0]["outcome"] == "stopped" and not group_members(rec.pgid)
    assert "smollm2" not in S.read_desired()["models"] and "gemma" in S.read_desired()["models"]


def test_a_wake_that_fails_becomes_a_cold_restart_and_is_said(sleepy):
    """smollm2's record says asleep, but llama.cpp has no way to wake: the wake fails at once, and the
    deck stops the launch and starts it fresh, recording both."""
    deck = Deck(sleepy)
    old = deck.start("smollm2").record
    mark_asleep("smollm2")
    words: list[str] = []
    res = deck.wake("smollm2", on_step=words.append)
    assert res.record.pid != old.pid and res.record.state == LaunchState.READY and not group_members(old.pgid)
    assert "its wake failed: engine 'llamacpp' has no way to wake" in res.woke["cold_restart"]
    assert words[0] == "wake" and words[1].startswith("cold restart (its wake failed")
    outcomes = [r["outcome"] for r in S.read_journal("smollm2") if r["event"] == "wake"]
    assert outcomes == ["begin", "failed", "cold-restarted"]


def test_an_engine_that_dies_asleep_is_settled_as_a_crash_and_not_relaunched(sleepy):
    from servedeck.watch import Watcher, read_notices

    deck = Deck(sleepy)
    rec = deck.start("smollm2").record
    mark_asleep("smollm2")
    from servedeck.deck.sleep import mark_desired

    mark_desired("smollm2", 1)
    assert S.read_desired()["models"]["smollm2"]["asleep"] == 1
    w = Watcher(sleepy, interval_s=0.2)
    w.tick()  # asleep and running: adopted, not probed, not relaunched
    os.kill(rec.engine_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(rec.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    w.tick()
    kinds = [n["kind"] for n in read_notices()]
    assert "crashed" in kinds and "relaunch" not in kinds
    crash = [r for r in S.read_journal("smollm2") if r["event"] == "crash"]
    assert crash[0]["outcome"] == "crashed" and crash[0]["was"] == "asleep" and "SIGKILL" in crash[0]["detail"]
    assert crash[1]["outcome"] == "not-wanted"
    assert "smollm2" not in S.read_desired()["models"] and S.read_live("smollm2") is None
    w.tick()
    assert "relaunch" not in [n["kind"] for n in read_notices()]


def test_restore_does_not_start_a_model_that_was_asleep(sleepy):
    from servedeck.deck.desired import settings_of

    S.set_desired("smollm2", {**settings_of("smollm2", sleepy), "asleep": 1})
    [out] = Deck(sleepy).restore()
    assert out["outcome"] == "not restored" and "asleep (level 1)" in out["error"]
    assert S.read_desired()["models"] == {} and S.read_live("smollm2") is None
    with pytest.raises(RefusedError):
        Deck(sleepy).wake("smollm2")
