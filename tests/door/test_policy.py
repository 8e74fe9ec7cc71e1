"""The swap policy, decided without processes: every branch of `decide`, replica choice and ttl."""

from __future__ import annotations

import pytest

from servedeck.door.policy import (
    DRAINING, FAILED, READY, STARTING, STOPPED, STOPPING, Replica, Settings, View, decide, idle_expired, pick_replica,
)

S = Settings(min_residency_s=30.0, drain_timeout_s=120.0)


def views(*vs: View) -> dict[str, View]:
    return {v.name: v for v in vs}


def test_ready_serves_and_starting_waits():
    assert decide("a", views(View("a", "main", READY)), 0, S).kind == "serve"
    act = decide("a", views(View("a", "main", STARTING)), 0, S)
    assert act.kind == "wait" and "starting" in act.reason


def test_a_free_slot_starts_and_other_slots_do_not_matter():
    vs = views(View("a", "main"), View("b", "other", READY, inflight=3))
    assert decide("a", vs, 0, S).kind == "start"


def test_an_idle_holder_is_switched_out():
    vs = views(View("a", "main", queued=1), View("b", "main", READY, ready_since=0.0, last_request=1.0))
    act = decide("a", vs, 100.0, S)
    assert act.kind == "switch" and act.evict == ("b",) and "held by b" in act.reason


def test_a_young_holder_whose_requests_all_finished_is_switched_out_at_once():
    """One user alternating two models: b answered one request and nothing runs or waits for it.
    A finished request is no claim on the slot, however recent (issue 20, item 14: 30 s per switch)."""
    vs = views(View("a", "main", queued=1), View("b", "main", READY, ready_since=90.0, last_request=99.5))
    act = decide("a", vs, 100.0, S)
    assert act.kind == "switch" and act.evict == ("b",)


def test_a_young_holder_in_use_keeps_the_slot_until_min_residency():
    """Truly contended: b has a request in flight when a wants the slot. b became ready 10 s ago, so it
    keeps the slot (still taking requests: not draining) until min_residency has passed, then drains."""
    vs = views(View("a", "main", queued=1), View("b", "main", READY, inflight=1, ready_since=90.0))
    act = decide("a", vs, 100.0, S)
    assert act.kind == "wait" and act.until == 120.0 and act.why == "min-residency"
    assert "min_residency" in act.reason
    assert decide("a", vs, 121.0, S).kind == "drain"


def test_a_holder_with_requests_queued_for_it_is_in_use():
    vs = views(View("a", "main", queued=1), View("b", "main", READY, queued=2, ready_since=90.0))
    assert decide("a", vs, 100.0, S).why == "min-residency"


def test_every_wait_says_why_in_the_words_of_the_waited_header():
    assert decide("a", views(View("a", "main", STARTING)), 0, S).why == "start"
    assert decide("a", views(View("a", "main", queued=1)), 0, S).why == "start"
    idle = views(View("a", "main", queued=1), View("b", "main", READY, ready_since=0.0))
    assert decide("a", idle, 100.0, S).why == "switch"
    busy = views(View("a", "main", queued=1), View("b", "main", READY, inflight=1, ready_since=0.0))
    assert decide("a", busy, 100.0, S).why == "drain"
    assert decide("a", views(View("a", "main", queued=1), View("b", "main", STARTING)), 0, S).why == "slot-busy"
    assert decide("b", views(View("b", "main", DRAINING), View("a", "main", STARTING)), 0, S).why == "slot-busy"


def test_waited_gives_each_stretch_to_the_reason_that_held_it():
    from servedeck.door import policy as P

    w = P.Waited(since=10.0)
    w.note(10.1, "min-residency")  # the first look: the time before it goes to the first reason
    w.note(25.0, "min-residency")
    w.note(38.2, "switch")  # the residency held until this look
    w.note(40.2, "")  # ready
    assert [(why, round(s, 6)) for why, s in w.parts] == [("min-residency", 28.2), ("switch", 2.0)]
    assert w.text() == "28.2s min-residency, 2.0s switch"


def test_waited_without_a_reason_says_nothing():
    from servedeck.door import policy as P

    w = P.Waited(since=0.0)
    w.note(0.0, "")
    assert w.parts == []
    assert w.text() == ""


def test_in_flight_requests_are_drained_then_the_deadline_ends_the_wait():
    vs = views(View("a", "main", queued=2), View("b", "main", READY, inflight=2, ready_since=0.0))
    act = decide("a", vs, 100.0, S)
    assert act.kind == "drain" and act.evict == ("b",) and act.until == 220.0 and "2 in-flight" in act.reason
    draining = views(View("a", "main", queued=2), View("b", "main", DRAINING, inflight=1, ready_since=0.0))
    assert decide("a", draining, 150.0, S, drain_started=100.0).kind == "drain"
    late = decide("a", draining, 221.0, S, drain_started=100.0)
    assert late.kind == "switch" and "drain_timeout" in late.reason
    done = views(View("a", "main", queued=2), View("b", "main", DRAINING, inflight=0, ready_since=0.0))
    assert decide("a", done, 150.0, S, drain_started=100.0).kind == "switch"


def test_a_draining_or_stopping_target_queues_behind_the_switch():
    for st in (DRAINING, STOPPING):
        act = decide("b", views(View("b", "main", st), View("a", "main", STARTING)), 0, S)
        assert act.kind == "wait" and "queues behind the switch" in act.reason


def test_another_boot_in_the_slot_is_waited_for():
    act = decide("a", views(View("a", "main", queued=1), View("b", "main", STARTING)), 0, S)
    assert act.kind == "wait" and "b is starting" in act.reason


def test_a_failed_boot_is_not_retried_before_its_spacing():
    vs = views(View("a", "main", FAILED, retry_at=60.0))
    act = decide("a", vs, 10.0, S)
    assert act.kind == "fail" and act.status == 502 and act.until == 60.0
    assert decide("a", vs, 61.0, S).kind == "start"
    refused = views(View("a", "main", STOPPED, retry_at=10.0))  # the deck said no (memory, port)
    act = decide("a", refused, 5.0, S)
    assert act.kind == "fail" and act.status == 503
    assert decide("a", refused, 11.0, S).kind == "start"


def test_pick_replica_takes_the_fewest_outstanding_then_spreads():
    rs = [Replica("http://a", outstanding=2), Replica("http://b", outstanding=0, sent=5), Replica("http://c", 0, 1)]
    assert pick_replica(rs).url == "http://c"
    rs[2].outstanding = 3
    assert pick_replica(rs).url == "http://b"


def test_ttl_expiry():
    v = View("a", "main", READY, ready_since=0.0, last_request=50.0)
    assert not idle_expired(v, None, 1000.0)
    assert not idle_expired(v, 60.0, 100.0) and idle_expired(v, 60.0, 110.0)
    assert not idle_expired(View("a", "main", READY, inflight=1, ready_since=0.0), 1.0, 100.0)
    assert not idle_expired(View("a", "main", STOPPED), 1.0, 100.0)


def test_replica_policies_are_found_by_name_and_an_unknown_one_is_named():
    from servedeck.door import policy as P
    from servedeck.errors import UsageError

    rs = [Replica("http://a", outstanding=1), Replica("http://b", outstanding=0)]
    assert P.replica_policy().pick(None, rs).url == "http://b"
    assert P.replica_policy("least-outstanding").name == "least-outstanding"
    with pytest.raises(UsageError) as e:
        P.replica_policy("round-robin")
    assert "'round-robin'" in str(e.value) and "least-outstanding" in e.value.hint
