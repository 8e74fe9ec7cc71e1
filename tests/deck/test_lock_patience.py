"""A command beside a watch loop is not told "busy" by the loop's routine pass.

CI (stop 45's fresh-clone run) saw `servedeck sleep smollm2-vllm`, run beside `servedeck serve`, exit 4: "the deck is
busy: pid N running `watch: reconcile`". The door's watch loop takes the deck lock on every pass for milliseconds, so
any start, stop or sleep typed while it runs could meet it at random. A caller now waits through such a pass (up to
`state.WATCH_TICK_PATIENCE_S`), and is still told at once of a start, a switch, or a pass that relaunches or reaps a
model (which says so on the lock). The loop itself and `status` never wait: they look again later."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from servedeck import paths
from servedeck.deck import state as S
from servedeck.errors import BusyError
from servedeck.fsio import read_holder
from servedeck.watch import Watcher


def _hold(what: str, seconds: float, held: threading.Event) -> None:
    with S.deck_lock(what):
        held.set()
        time.sleep(seconds)  # the holder's own work, not a wait for something: a pass this long


def test_a_cli_command_waits_through_a_routine_watch_pass(deck_config):
    held = threading.Event()
    holder = threading.Thread(target=_hold, args=(S.WATCH_TICK, 1.0, held))
    holder.start()
    try:
        assert held.wait(10)
        r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(deck_config.path), "stop", "--all"],
                           capture_output=True, text=True, timeout=120)
    finally:
        holder.join()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "busy" not in r.stderr, r.stderr


def test_a_pass_that_relaunches_a_model_is_said_at_once():
    with S.deck_lock(S.WATCH_TICK):
        S.deck_lock_says("watch: relaunch 1/3 of smollm2")
        t0 = time.monotonic()
        with pytest.raises(BusyError) as e:
            with S.deck_lock("stop --all"):
                pass
        waited = time.monotonic() - t0
    assert "running `watch: relaunch 1/3 of smollm2`" in e.value.message, e.value.message
    assert waited < S.WATCH_TICK_PATIENCE_S / 2, waited


def test_a_pass_that_does_not_end_is_said_once_the_patience_is_spent(monkeypatch):
    monkeypatch.setattr(S, "WATCH_TICK_PATIENCE_S", 0.4)
    with S.deck_lock(S.WATCH_TICK):
        t0 = time.monotonic()
        with pytest.raises(BusyError) as e:
            with S.deck_lock("sleep smollm2", wait_s=0.2):
                pass
        waited = time.monotonic() - t0
    assert "running `watch: reconcile`" in e.value.message, e.value.message
    assert waited >= 0.2 + 0.4 - 0.05, waited  # its own --wait, then the patience


def test_who_is_waited_through():
    assert S.watch_tick_patience({"pid": 1, "what": S.WATCH_TICK}) == S.WATCH_TICK_PATIENCE_S
    assert S.watch_tick_patience(None) == S.WATCH_TICK_PATIENCE_S  # took the lock, has not said who it is yet
    for what in ("start smollm2", "switch gemma", "watch: relaunch 1/3 of smollm2", "watch: reap smollm2"):
        assert S.watch_tick_patience({"pid": 1, "what": what}) == 0.0, what


def test_the_watch_loop_never_waits_for_the_lock_and_reads_desired_state_under_it(deck_config, monkeypatch):
    """A watch pass that waited for the lock with desired state read before it reaped the model a door switch had
    just started (a fresh-clone run, 2026-12-06: gemma reaped 'not in desired state' right after `switch gemma`
    ok). The loop looks again next tick instead of waiting, and reads desired state only once it holds the lock."""
    w = Watcher(deck_config, interval_s=0.2)
    with S.deck_lock("switch gemma"):
        t0 = time.monotonic()
        w.tick()
        assert time.monotonic() - t0 < S.WATCH_TICK_PATIENCE_S / 2
    holders: list[dict | None] = []
    read = S.read_desired
    monkeypatch.setattr(S, "read_desired", lambda: (holders.append(read_holder(paths.lock_file())), read())[1])
    w.tick()
    assert holders  # the pass read desired state
    assert all(h is not None for h in holders), holders  # with the lock held
    assert all(h["what"] == S.WATCH_TICK for h in holders), holders  # by the pass itself
