"""The swap policy, decided without processes: every branch of `decide`, replica choice and ttl."""

from __future__ import annotations

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


def test_no_thrash_within_min_residency_while_the_holder_has_traffic():
    vs = views(View("a", "main", queued=1), View("b", "main", READY, ready_since=90.0, last_request=95.0))
    act = decide("a", vs, 100.0, S)
    assert act.kind == "wait" and act.until == 120.0 and "min_residency" in act.reason
    # without traffic the young holder goes at once
    quiet = views(View("a", "main", queued=1), View("b", "main", READY, ready_since=90.0))
    assert decide("a", quiet, 100.0, S).kind == "switch"
    # and after the residency it goes too
    assert decide("a", vs, 121.0, S).kind == "switch"


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
