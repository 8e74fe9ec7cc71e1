"""The door's swap policy with sleeping models, decided without processes: a sleeping target is woken,
a sleeping model holds no slot, ttl_sleep comes before ttl, and a request's x-servedeck-waited carries
the words the deck says for each phase (sleep, wake, a cold switch and why)."""

from __future__ import annotations

from servedeck.door import policy as P
from servedeck.door.policy import ASLEEP, READY, STOPPED, Settings, View, decide, idle_expired, sleep_due

S = Settings(min_residency_s=30.0, drain_timeout_s=120.0)


def views(*vs: View) -> dict[str, View]:
    return {v.name: v for v in vs}


def test_a_sleeping_target_in_a_free_slot_is_woken_not_started():
    act = decide("a", views(View("a", "main", ASLEEP, queued=1)), 0, S)
    assert act.kind == "wake" and act.why == "wake" and "asleep" in act.reason


def test_a_sleeping_target_behind_an_idle_holder_is_a_switch():
    vs = views(View("a", "main", ASLEEP, queued=1), View("b", "main", READY, ready_since=0.0))
    act = decide("a", vs, 100.0, S)
    assert act.kind == "switch" and act.evict == ("b",)


def test_a_sleeping_target_behind_a_holder_in_use_waits_out_residency_and_drains_as_any_other():
    vs = views(View("a", "main", ASLEEP, queued=1), View("b", "main", READY, inflight=1, ready_since=90.0))
    assert decide("a", vs, 100.0, S).why == "min-residency"
    assert decide("a", vs, 121.0, S).kind == "drain"


def test_a_sleeping_model_holds_no_slot():
    """b sleeps in a's slot: a starts as in a free slot, and b is not evicted (it keeps its fast wake)."""
    vs = views(View("a", "main", STOPPED, queued=1), View("b", "main", ASLEEP))
    act = decide("a", vs, 0, S)
    assert act.kind == "start" and act.evict == ()


def test_ttl_sleep_comes_first_then_ttl_stops_the_sleeping_model():
    ready = View("a", "main", READY, ready_since=0.0, last_request=10.0)
    assert not sleep_due(ready, 60.0, 69.0) and sleep_due(ready, 60.0, 70.0)
    assert not sleep_due(View("a", "main", READY, inflight=1, last_request=0.0), 60.0, 1000.0)
    asleep = View("a", "main", ASLEEP, ready_since=0.0, last_request=10.0)
    assert not sleep_due(asleep, 60.0, 1000.0)  # already asleep
    assert idle_expired(asleep, 600.0, 610.0) and not idle_expired(asleep, 600.0, 609.0)
    assert not sleep_due(ready, None, 1e9)


def test_waited_reports_each_phase_the_deck_named():
    """The slot worker decides `switch`; the deck then says `sleep` (holder to sleep), then `wake`
    (target woken): the header splits the wait between them, in order."""
    w = P.Waited(since=0.0)
    w.note(0.0, "switch")
    w.note(0.1, "sleep")  # the deck, before it tells the holder to sleep
    w.note(0.5, "wake")  # the deck, before it wakes the target
    w.note(1.0, "")  # the target is ready: the request looks one last time
    assert w.text() == "0.1s switch, 0.4s sleep, 0.5s wake"


def test_waited_says_a_cold_switch_and_why_and_leaves_out_the_moment_before_the_deck_named_it():
    w = P.Waited(since=0.0)
    w.note(0.0, "switch")
    w.note(0.01, "switch (cold: smol cannot sleep: engine 'llamacpp' has no sleep mode)")
    w.note(3.21, "")
    assert w.text() == "3.2s switch (cold: smol cannot sleep: engine 'llamacpp' has no sleep mode)"


def test_the_deck_naming_the_phase_more_closely_takes_over_the_door_s_word():
    """The door decided `switch`; 0.2 s later (its health check and plan) the deck says the holder goes
    cold and why: one part, under the closer name. `sleep` after `switch` is another phase: two parts."""
    w = P.Waited(since=0.0)
    w.note(0.0, "switch")
    w.note(0.2, "switch (cold: a cannot sleep: engine 'llamacpp' has no sleep mode)")
    w.note(3.0, "")
    assert w.text() == "3.0s switch (cold: a cannot sleep: engine 'llamacpp' has no sleep mode)"
    v = P.Waited(since=0.0)
    v.note(0.0, "wake")
    v.note(0.1, "wake (level 2)")
    v.note(4.0, "")
    assert v.text() == "4.0s wake (level 2)"
