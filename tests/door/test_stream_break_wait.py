"""How long the door looks, after a server broke off a stream, before it says the engine is still running
(door/manager.py's still_up_after_a_break). Pure: a fake clock and fake liveness, no process."""

from __future__ import annotations

from servedeck.door.manager import ENGINE_STILL_UP_S, STREAM_END_WAIT_S, still_up_after_a_break


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def gone_at(clock: Clock, t: float):
    """Liveness that is true until `t` seconds after the clock's start."""
    start = clock.t
    return lambda: clock.t - start < t


def judge(engine_gone_at: float, shim_gone_at: float) -> tuple[bool, float]:
    c = Clock()
    up = still_up_after_a_break(gone_at(c, engine_gone_at), gone_at(c, shim_gone_at), clock=c, sleep=c.sleep)
    return up, c.t - 100.0


def test_a_group_killed_whose_shim_is_gone_first_gives_the_engine_its_moment():
    # the defect: the shim (small) was gone at once, the engine 0.3 s later; the door had looked only once
    up, _ = judge(engine_gone_at=0.3, shim_gone_at=0.0)
    assert up is False


def test_the_wait_ends_when_both_are_gone():
    _, waited = judge(engine_gone_at=0.3, shim_gone_at=0.0)
    assert 0.3 <= waited < 0.4


def test_an_engine_still_up_is_called_up_after_its_moment():
    up, waited = judge(engine_gone_at=60, shim_gone_at=60)
    assert up is True
    assert ENGINE_STILL_UP_S <= waited < ENGINE_STILL_UP_S + 0.1


def test_an_engine_gone_waits_for_its_shim_to_record_how_it_ended():
    up, waited = judge(engine_gone_at=0.0, shim_gone_at=1.2)
    assert up is False
    assert 1.2 <= waited < 1.3


def test_a_shim_that_never_ends_is_waited_for_no_longer_than_the_bound():
    up, waited = judge(engine_gone_at=0.0, shim_gone_at=60)
    assert up is False
    assert STREAM_END_WAIT_S <= waited < STREAM_END_WAIT_S + 0.1


def test_an_engine_that_dies_after_its_moment_is_still_called_up():
    up, _ = judge(engine_gone_at=ENGINE_STILL_UP_S + 0.5, shim_gone_at=60)
    assert up is True
