"""The replicas' balancer's one decision, without processes: which replica the next request goes to."""

from __future__ import annotations

from servedeck.loadgen.spread import Spread


def _spread(n: int = 2) -> Spread:
    return Spread([object()] * n)  # type: ignore[list-item]  # pick() reads only its own counts


def _burst(s: Spread, n: int) -> list[int]:
    """n requests sent before any finishes, as a closed loop's users open."""
    out = []
    for _ in range(n):
        i = s.pick()
        s.outstanding[i] += 1
        s.sent[i] += 1
        out.append(i)
    return out


def test_an_opening_burst_alternates_between_the_replicas():
    assert _burst(_spread(), 4) == [0, 1, 0, 1]
    assert _burst(_spread(3), 6) == [0, 1, 2, 0, 1, 2]


def test_a_burst_beside_a_request_still_in_flight_still_gives_each_replica_half():
    s = _spread()
    s.outstanding[0], s.sent[0] = 1, 1  # the warm-up, not yet answered
    picks = _burst(s, 4)
    assert picks.count(0) == 2, picks
    assert picks.count(1) == 2, picks


def test_the_replica_with_fewer_in_flight_wins_then_the_one_sent_fewer():
    s = _spread()
    s.outstanding, s.sent = [2, 1], [2, 9]
    assert s.pick() == 1  # a slow replica keeps its requests in flight, so the fast one is sent more
    s.outstanding, s.sent = [1, 1], [5, 3]
    assert s.pick() == 1
    s.outstanding, s.sent = [1, 1], [3, 3]
    assert s.pick() == 0
