"""`servedeck start MODEL --foreground`: a launch through the deck that stays in the foreground.

This is what a systemd unit runs (`servedeck unit MODEL`): the engine starts exactly as `start` starts
it (live record, launch folder, desired state, journal), so `status`, `logs` and `watch` see it; then
this process waits until the engine ends.

    SIGTERM / SIGINT / SIGHUP  the deck stops the model (SIGTERM to its process group, grace, SIGKILL)
                               and this process exits 0: a requested stop is not a failure
    the engine ends by itself  the deck settles the launch (crashed, with its classified cause) and
                               this process exits with the engine's code (128+N for signal N), so
                               systemd's Restart=on-failure sees a failure as one
    `servedeck stop MODEL`     the model leaves desired state; this process exits 0 (no restart)

Only the deck's public operations are used (start, stop, status, and `settle_dead` under its lock):
the deck's lock keeps one owner.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from servedeck.deck.deck import Deck
from servedeck.deck.records import StartResult
from servedeck.errors import BusyError
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stopped(KeyboardInterrupt):
    """A stop signal while the engine was still starting: the deck's start cleans up as for Ctrl-C."""


@contextmanager
def _signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def exit_code(exit_info: dict | None) -> int:
    """The engine's end as a process exit code: its return code, 128+N for signal N, 1 when unknown."""
    if not exit_info:
        return 1
    if exit_info.get("signal"):
        try:
            return 128 + int(signal.Signals[exit_info["signal"]])
        except KeyError:
            return 1
    rc = exit_info.get("returncode")
    return rc if isinstance(rc, int) else 1


def run_foreground(deck: Deck, name: str, *, on_started: Callable[[StartResult], None] | None = None,
                   poll_s: float = 0.5, stop_wait_s: float = 60.0, evict: Iterable[str] = ()) -> int:
    """Start `name` through the deck, wait for its engine to end, return the exit code to leave with."""
    def during_start(signum: int, _frame: object) -> None:
        raise _Stopped(signal.Signals(signum).name)

    with _signals(during_start):
        try:
            res = deck.start(name, evict=evict)
        except _Stopped:
            return 0  # the deck stopped what it had spawned and recorded the start as interrupted
    if on_started is not None:
        on_started(res)
    rec = res.record
    stop = threading.Event()
    with _signals(lambda signum, _frame: stop.set()):
        while P.alive(rec.pid, rec.create_time):
            if stop.wait(poll_s):
                deck.stop([name], wait_s=stop_wait_s)
                return 0
    # the shim is gone: settle the launch (crashed, its cause, the journal line); an engine the shim left
    # running (the shim was killed from outside) is stopped there, so this process leaves nothing behind
    try:
        with deck.locked(f"start {name} --foreground: settle", wait_s=stop_wait_s) as ops:
            ops.settle_dead()
    except BusyError:
        pass  # whoever holds the lock settles it
    wanted = any(s.model == name and s.desired for s in deck.status())
    if not wanted:
        return 0  # stopped through the deck (`servedeck stop`): not a failure, nothing to restart
    return exit_code(R.read_exit(Path(rec.launch_dir)))
