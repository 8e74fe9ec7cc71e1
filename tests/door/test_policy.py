"""The swap policy, decided without processes: every branch of `decide`, replica choice and ttl."""

from __future__ import annotations

import pytest

from servedeck.door.policy import (
    DRAINING, FAILED, READY, STARTING, STOPPED, STOPPING, Ask, Replica, Settings, View, decide, idle_expired,
    pick_replica,
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


# --- routing policies: session and prefix (issue 25) ------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a terse assistant. " * 8}


def chat(*turns: str, session: str | None = None) -> "Ask":
    """A chat request whose messages are the system prompt then `turns` (user, assistant, user, …)."""
    import json

    from servedeck.door.policy import Ask

    msgs = [SYSTEM] + [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    doc = {"model": "m", "messages": msgs}
    headers = [(b"content-type", b"application/json")] + ([(b"X-Session-Id", session.encode())] if session else [])
    return Ask(b"/v1/chat/completions", headers, json.dumps(doc).encode(), doc)


def send(p, ask, rs: list[Replica]) -> str:
    """Pick as the manager does: the chosen replica counts one more request outstanding and sent."""
    r = p.pick(ask, rs)
    r.outstanding += 1
    r.sent += 1
    return r.url


def pair(a_out: int = 0, b_out: int = 0) -> list[Replica]:
    return [Replica("http://a", outstanding=a_out), Replica("http://b", outstanding=b_out)]


def test_session_pins_a_header_named_conversation_while_its_replica_is_within_the_bound():
    from servedeck.door.policy import Session

    p, rs = Session(imbalance=2), pair()
    first = p.pick(chat("hi", session="u1"), rs).url
    rs[[r.url for r in rs].index(first)].outstanding = 2  # busier, but only by the bound
    assert p.pick(chat("hi", "yo", "more", session="u1"), rs).url == first


def test_session_without_the_header_pins_by_the_system_prompt_and_first_user_message():
    from servedeck.door.policy import Session

    p, rs = Session(), pair()
    first = p.pick(chat("plan a trip to Oslo"), rs).url
    rs[[r.url for r in rs].index(first)].outstanding = 1  # least-outstanding alone would now go elsewhere
    assert p.pick(chat("plan a trip to Oslo", "Sure: …", "and Bergen?"), rs).url == first


def test_session_falls_back_to_least_outstanding_when_its_replica_is_overloaded_and_re_pins_there():
    from servedeck.door.policy import Session

    p = Session(imbalance=2)
    rs = pair()
    assert p.pick(chat("q", session="u1"), rs).url == "http://a"  # idle pair: the first, fewest sent
    rs[0].outstanding = 3  # 3 > 0 + 2: overloaded
    assert p.pick(chat("q", session="u1"), rs).url == "http://b"
    rs[0].outstanding = 0
    rs[1].outstanding = 1  # a recovered, b is busier: the pin stays where it moved
    assert p.pick(chat("q", session="u1"), rs).url == "http://b"


def test_session_re_pins_when_its_replica_is_gone():
    from servedeck.door.policy import Session

    p = Session()
    assert p.pick(chat("q", session="u1"), pair()).url == "http://a"
    only_b = [Replica("http://b", outstanding=2)]
    assert p.pick(chat("q", session="u1"), only_b).url == "http://b"
    assert p.pins[b"h:u1"] == "http://b"


def test_session_keeps_at_most_sessions_max_pins_forgetting_the_least_recent():
    from servedeck.door.policy import Session

    p, rs = Session(sessions_max=2), pair()
    for s in ("u1", "u2", "u3"):
        p.pick(chat("q", session=s), rs)
    assert list(p.pins) == [b"h:u2", b"h:u3"]


def test_session_and_prefix_route_a_request_without_a_readable_body_least_outstanding():
    from servedeck.door.policy import Ask, Prefix, Session

    not_json = Ask(b"/v1/chat/completions", [], b"not json", None)
    for p in (Session(), Prefix()):
        rs = pair(a_out=1)
        assert p.pick(None, rs).url == "http://b"  # the door's own request (preload)
        assert p.pick(not_json, rs).url == "http://b"
        assert not rs[0].recent and not rs[1].recent
    s = Session()
    s.pick(not_json, pair())
    assert not s.pins


def test_prefix_sends_a_conversation_to_the_replica_that_saw_its_earlier_turns():
    from servedeck.door.policy import Prefix

    p, rs = Prefix(imbalance=4), pair()
    owls, bread = "tell me about owls " * 30, "a recipe for bread " * 30  # each longer than the system prompt
    first = send(p, chat(owls), rs)
    other = send(p, chat(bread), rs)
    assert other != first  # under half its opening is shared (the system prompt): least-outstanding
    busy = [r for r in rs if r.url == first][0]
    busy.outstanding = 3  # within the bound of 4
    assert p.pick(chat(owls, "Owls are…", "and barn owls?"), rs).url == first


def test_prefix_sends_a_request_sharing_under_min_share_of_its_opening_least_outstanding():
    from servedeck.door.policy import Prefix

    p, rs = Prefix(min_share=0.5), pair()
    p.pick(chat("q"), rs)  # → a; its opening is mostly the system prompt
    rs[0].outstanding = 1
    assert p.pick(chat("q" * 300), rs).url == "http://b"  # shares the system prompt only: < half
    assert p.pick(chat("q", "answer", "next"), rs).url == "http://a"  # shares all of turn 1: > half


def test_prefix_chooses_the_longest_shared_prefix_among_replicas():
    from servedeck.door.policy import Prefix, opening

    p, rs = Prefix(), pair()
    rs[0].recent.append(opening(chat("tell me about owls").doc, 10_000))
    rs[1].recent.append(opening(chat("tell me about owls", "Owls are…", "and barn owls?").doc, 10_000))
    turn3 = chat("tell me about owls", "Owls are…", "and barn owls?", "Barn owls…", "where do they live?")
    assert p.pick(turn3, rs).url == "http://b"


def test_prefix_skips_a_replica_past_the_imbalance_bound_however_long_its_match():
    from servedeck.door.policy import Prefix

    p = Prefix(imbalance=2)
    rs = pair()
    p.pick(chat("tell me about owls"), rs)  # → a
    rs[0].outstanding = 3  # 3 > 0 + 2
    assert p.pick(chat("tell me about owls", "Owls are…", "more"), rs).url == "http://b"


def test_prefix_spreads_new_conversations_behind_one_system_prompt_and_keeps_each_on_its_replica():
    # 16 openings behind the same system prompt arrive at once (none finishes): only the system prompt is
    # cached anywhere, so each goes to the least loaded replica; each next turn follows its own history
    from servedeck.door.policy import Prefix

    p, rs = Prefix(imbalance=4), pair()
    firsts = [f"user {u} asks about topic {u} " * 3 for u in range(16)]
    where = [send(p, chat(q), rs) for q in firsts]
    assert sorted(where.count(u) for u in ("http://a", "http://b")) == [8, 8], where
    for r in rs:
        r.outstanding = 0
    again = [send(p, chat(q, "an answer", "a follow-up"), rs) for q in firsts]
    assert again == where


def test_prefix_follows_a_shared_context_to_its_replica_while_that_one_is_no_busier():
    from servedeck.door.policy import Prefix

    p, rs = Prefix(), pair()
    doc = "a long shared document " * 20
    assert send(p, chat(doc + "question 1"), rs) == "http://a"
    rs[0].outstanding = 0
    assert p.pick(chat(doc + "question 2"), rs).url == "http://a"  # idle: its cached document is the reason
    rs[0].outstanding = 1
    assert p.pick(chat(doc + "question 3"), rs).url == "http://b"  # busier than b: balance instead


def test_prefix_memory_per_replica_is_bounded_in_entries_and_characters():
    from servedeck.door.policy import RECENT_PER_REPLICA, Prefix

    p, rs = Prefix(prefix_chars=100), [Replica("http://a")]
    for i in range(RECENT_PER_REPLICA + 10):
        p.pick(chat(f"question {i} " + "x" * 500), rs)
    assert len(rs[0].recent) == RECENT_PER_REPLICA
    assert max(len(t) for t in rs[0].recent) == 100


def test_shared_prefix_counts_leading_characters_in_common():
    from servedeck.door.policy import shared_prefix

    assert shared_prefix("abcdef", "abcxyz") == 3
    assert shared_prefix("abc", "abcdef") == 3
    assert shared_prefix("", "abc") == 0
    assert shared_prefix("xbc", "abc") == 0


def test_routing_policies_take_their_knobs_and_match_what_models_toml_accepts():
    from servedeck.config.schema import ROUTING_KNOBS, Routing
    from servedeck.door import policy as P

    assert {n: c.knobs for n, c in P.POLICIES.items()} == ROUTING_KNOBS
    p = P.replica_policy(**Routing.model_validate({"policy": "session", "header": "X-Conv", "imbalance": 1})
                         .model_dump())
    assert isinstance(p, P.Session) and p.header == b"x-conv" and p.imbalance == 1
    assert p.prefix_chars == P.PREFIX_CHARS  # left out: the default


def test_shared_prefix_under_the_caller_s_best_so_far_is_not_counted_past_it():
    from servedeck.door.policy import shared_prefix

    assert shared_prefix("abcdef", "abcxyz", floor=4) <= 4
    assert shared_prefix("abcdefgh", "abcdefxy", floor=2) == 6


# --- progress (issue 48 item 2): a model switched in serves the requests that waited for it -----------------

S0 = Settings(min_residency_s=0.0, drain_timeout_s=120.0)


def test_a_holder_that_just_became_ready_serves_its_waiters_before_it_is_switched_out():
    """The livelock of issue 48: with min_residency_s = 0, b had just been switched in for its two waiting
    requests and a's two waited too. b counted as idle (nothing in flight yet) and was switched out before
    its waiters ran; then a, the same way: 29-33 switches in 40 s, no answer. Queued requests of a ready
    holder are demand, whatever min_residency_s says."""
    vs = views(View("a", "main", queued=2), View("b", "main", READY, queued=2, ready_since=100.0))
    act = decide("a", vs, 100.0, S0)
    assert act.kind == "wait" and act.why == "handover" and "b (2 waiting)" in act.reason
    assert decide("a", vs, 10_000.0, S0).kind == "wait"  # however long: the waiters are being woken to take it


def test_once_the_waiters_took_the_holder_it_drains_then_switches():
    """The handover's end: b's waiters are in flight (queued 0), so the switch drains them and goes."""
    vs = views(View("a", "main", queued=2), View("b", "main", READY, inflight=2, ready_since=100.0))
    assert decide("a", vs, 100.0, S0).kind == "drain"
    vs = views(View("a", "main", queued=2), View("b", "main", READY, ready_since=100.0))
    assert decide("a", vs, 101.0, S0).kind == "switch"


def test_requests_queued_behind_a_draining_holder_do_not_stop_the_switch():
    """A draining holder's new requests queue behind the switch (it takes none): they are no handover, or
    a holder with steady traffic would never drain."""
    vs = views(View("a", "main", queued=1), View("b", "main", DRAINING, queued=3, ready_since=0.0))
    assert decide("a", vs, 100.0, S0, drain_started=99.0).kind == "switch"


def simulate(arrivals: dict[str, int], settings: Settings, steps: int = 400) -> tuple[dict[str, int], int]:
    """The slot worker and its waiters as a pure model, in the order the door's event loop runs them: the
    worker decides for the oldest wanting model; after a start or switch it decides again at once (it takes
    the lock back before the waiters it woke can run); only while it waits (or drains) do the waiters of a
    ready model take it, and what is in flight finishes. Returns what was served and the switches."""
    queued = dict(arrivals)
    served = {m: 0 for m in arrivals}
    state = {m: STOPPED for m in arrivals}
    inflight = {m: 0 for m in arrivals}
    since = {m: 0.0 for m in arrivals}  # want_since: the oldest wanting model goes first
    switches = 0
    for step in range(steps):
        wanting = [m for m in arrivals if queued[m] and state[m] != READY]
        if not wanting:  # the worker ends; the waiters of the ready model take it
            break
        target = min(wanting, key=lambda m: since[m])
        vs = views(*(View(m, "main", state[m], inflight[m], queued[m], ready_since=0.0) for m in arrivals))
        act = decide(target, vs, float(step), settings)
        if act.kind in ("start", "switch"):
            for e in act.evict:
                state[e] = STOPPED
                if queued[e]:
                    since[e] = float(step)  # its waiters want it again
            state[target] = READY
            switches += bool(act.evict)
            continue
        for m in arrivals:  # the worker waits: woken waiters take their ready model, in flight finishes
            served[m] += inflight[m]
            inflight[m] = 0
            if state[m] == READY:
                inflight[m], queued[m] = queued[m], 0
    for m in arrivals:
        served[m] += inflight[m] + (queued[m] if state[m] == READY else 0)
    return served, switches


@pytest.mark.parametrize("arrivals", [{"a": 2, "b": 2}, {"a": 17, "b": 17, "c": 16}])
def test_every_waiting_request_is_served_with_one_switch_per_model(arrivals):
    """The four- and fifty-request cases of issue 48 as the policy sees them: each model is switched in
    once and serves everything that waited for it."""
    served, switches = simulate(arrivals, S0)
    assert served == arrivals
    assert switches <= len(arrivals) - 1
