"""The pure decisions about sleeping models (deck/sleeping.py), without processes: at what level a model
goes to sleep given host memory, what a switch does with each state of the slot's holder, and which
sleeping model to stop when memory runs short. Sizes are an 8B model's bf16 weights (15 GiB) on a host
like the H200 machine's (128 GiB), or one squeezed to make the rule bite."""

from __future__ import annotations

import pytest

from servedeck.deck.sleeping import (KEEP, NOTHING, RESIDUAL_GUESS, SLEEP, START, STOP, WAKE, GpuRoom, Holder, HostMemory,
                                     Sleeper, plan_switch, sleep_level, to_stop)

GiB = 2**30
W8B = 15 * GiB  # what level 1 pins for an 8B model in bf16


def host(avail_gib: float | None, cap_gib: float | None = None, margin_gib: float = 4) -> HostMemory:
    return HostMemory(None if avail_gib is None else int(avail_gib * GiB),
                      None if cap_gib is None else int(cap_gib * GiB), int(margin_gib * GiB))


# --- sleep level -------------------------------------------------------------------------------

def test_level_1_when_host_memory_holds_the_weights_with_the_margin():
    lv = sleep_level("a", "auto", (1, 2), "", W8B, host(100))
    assert lv.level == 1 and "15.0 GiB" in lv.why and "100.0 GiB available" in lv.why


def test_level_1_at_the_margin_exactly_and_level_2_one_byte_past_it():
    exact = HostMemory(W8B + 4 * GiB, None, 4 * GiB)
    assert sleep_level("a", "auto", (1, 2), "", W8B, exact).level == 1
    short = HostMemory(W8B + 4 * GiB - 1, None, 4 * GiB)
    lv = sleep_level("a", "auto", (1, 2), "", W8B, short)
    assert lv.level == 2 and "do not fit" in lv.why and "reloaded from disk" in lv.why


def test_sleep_1_never_falls_to_level_2_it_stops_cold():
    lv = sleep_level("a", 1, (1, 2), "", W8B, host(16))
    assert lv.level is None and "allows no level 2" in lv.why and "sleep = 1" in lv.why


def test_sleep_2_sleeps_at_level_2_whatever_host_memory_holds():
    assert sleep_level("a", 2, (1, 2), "", W8B, host(1)).level == 2
    assert sleep_level("a", 2, (1, 2), "", W8B, host(None)).level == 2


def test_every_level_1_sleeper_counts_against_sleep_ram_gib():
    """A cap of 20 GiB with one 8B model already asleep at level 1: the second goes to level 2, however
    much the host has available; a level-2 sleeper pins nothing and does not count."""
    one_asleep = [Sleeper("b", 1, W8B)]
    lv = sleep_level("a", "auto", (1, 2), "", W8B, host(500, cap_gib=20), one_asleep)
    assert lv.level == 2 and "b 15.0 GiB" in lv.why and "sleep_ram_gib 20.0 GiB" in lv.why
    at_level_2 = [Sleeper("b", 2, 0)]
    assert sleep_level("a", "auto", (1, 2), "", W8B, host(500, cap_gib=20), at_level_2).level == 1


def test_without_a_cap_what_sleepers_pin_is_already_out_of_available_and_not_counted_twice():
    """psutil's available memory is net of pinned memory: a level-1 sleeper must not be subtracted again."""
    asleep = [Sleeper("b", 1, W8B)]
    assert sleep_level("a", "auto", (1, 2), "", W8B, host(20), asleep).level == 1


def test_unknown_weights_or_unknown_host_memory_never_justify_level_1():
    assert sleep_level("a", "auto", (1, 2), "", None, host(500)).level == 2
    assert sleep_level("a", "auto", (1, 2), "", W8B, host(None)).level == 2
    cold = sleep_level("a", 1, (1, 2), "", None, host(500))
    assert cold.level is None and "not known" in cold.why


@pytest.mark.parametrize("key,can,cannot,says", [
    (False, (1, 2), "", "sleep = false"),
    ("auto", (), "engine 'llamacpp' has no sleep mode", "cannot sleep: engine 'llamacpp' has no sleep mode"),
    (1, (), "build 'cpu' is vLLM's CPU wheel", "cannot sleep: build 'cpu' is vLLM's CPU wheel"),
])
def test_a_model_that_may_not_or_cannot_sleep_is_stopped_and_why_is_said(key, can, cannot, says):
    lv = sleep_level("a", key, can, cannot, W8B, host(500))
    assert lv.level is None and says in lv.why


def test_an_engine_that_sleeps_at_level_1_only_goes_cold_when_host_memory_is_short():
    """SGLang's memory saver keeps the weights on the host (level 1) and has no level 2 here."""
    assert sleep_level("a", "auto", (1,), "", W8B, host(100)).level == 1
    assert sleep_level("a", "auto", (1,), "", W8B, host(10)).level is None


# --- what a switch does with each state of the holder ---------------------------------------------

def holder(name: str, state: str = "ready", key="auto", can=(1, 2), weights=W8B, cannot="") -> Holder:
    sleeper = Sleeper(name, 1, weights or 0) if state == "asleep" else None
    return Holder(name, state, key, can, cannot, weights, sleeper)


@pytest.mark.parametrize("state,act", [("ready", SLEEP), ("asleep", KEEP), ("starting", STOP), ("unhealthy", STOP)])
def test_switch_for_each_state_of_the_holder(state, act):
    steps = plan_switch("b", None, [holder("a", state)], host(100))
    assert [(s.act, s.model) for s in steps] == [(act, "a"), (START, "b")]
    if act == SLEEP:
        assert steps[0].level == 1
    if state == "unhealthy":
        assert "health check" in steps[0].why


@pytest.mark.parametrize("target_state,act", [(None, START), ("asleep", WAKE), ("ready", NOTHING)])
def test_switch_wakes_a_sleeping_target_and_starts_a_stopped_one(target_state, act):
    steps = plan_switch("b", target_state, [holder("a")], host(100))
    assert steps[-1].act == act and steps[-1].model == "b"


def test_a_holder_that_cannot_sleep_is_stopped_cold_with_its_reason():
    steps = plan_switch("b", None, [holder("a", can=(), cannot="engine 'llamacpp' has no sleep mode")], host(100))
    assert steps[0].act == STOP and "engine 'llamacpp' has no sleep mode" in steps[0].why
    off = plan_switch("b", None, [holder("a", key=False)], host(100))
    assert off[0].act == STOP and "sleep = false" in off[0].why


def test_replicas_put_to_sleep_together_each_see_the_host_memory_the_others_pinned():
    """Two replicas of one 8B entry on a host with 36 GiB available (4 kept free): the first fits at
    level 1 (15 of 32), the second still does (15 of 17 left), a third would not (2 left): level 2."""
    steps = plan_switch("b", None, [holder("a.r1"), holder("a.r2"), holder("a.r3")], host(36))
    assert [(s.model, s.level) for s in steps[:-1]] == [("a.r1", 1), ("a.r2", 1), ("a.r3", 2)]


def test_three_model_rotation_where_host_memory_fits_one_level_1_sleeper():
    """a is asleep at level 1 (15 GiB) under sleep_ram_gib = 20: when b makes way for c, b goes to
    level 2; when c then makes way for a, c goes to level 2 as well, and a is woken."""
    asleep_a = Sleeper("a", 1, W8B)
    to_c = plan_switch("c", None, [holder("b")], host(100, cap_gib=20), [asleep_a])
    assert [(s.act, s.model, s.level) for s in to_c] == [(SLEEP, "b", 2), (START, "c", None)]
    to_a = plan_switch("a", "asleep", [holder("c")], host(100, cap_gib=20), [asleep_a, Sleeper("b", 2, 0)])
    assert [(s.act, s.model, s.level) for s in to_a] == [(SLEEP, "c", 2), (WAKE, "a", None)]


def test_a_holder_whose_residual_would_leave_the_target_short_of_gpu_memory_is_stopped_instead():
    """An H200 (141 GiB) with util 0.98 for the target: 138.2 GiB needed. Stopped, the holder frees the
    whole card; asleep it would keep 3 GiB (its measured residual), leaving 138 GiB: not enough."""
    room = GpuRoom(need={0: int(0.98 * 141 * GiB)}, free_if_stopped={0: 141 * GiB})
    h = Holder("a", "ready", "auto", (1, 2), "", W8B, None, residual={0: 3 * GiB})
    [stop, start] = plan_switch("b", None, [h], host(100), gpu=room)
    assert stop.act == STOP and "would keep 3.0 GiB of GPU 0" in stop.why and "b needs 138.2 GiB" in stop.why
    roomy = GpuRoom(need={0: int(0.9 * 141 * GiB)}, free_if_stopped={0: 141 * GiB})
    assert plan_switch("b", None, [h], host(100), gpu=roomy)[0].act == SLEEP  # 126.9 of 138 GiB


def test_two_holders_asleep_keep_both_residuals_and_the_second_is_stopped_when_they_add_up_too_much():
    room = GpuRoom(need={0: 136 * GiB}, free_if_stopped={0: 141 * GiB})
    holders = [Holder(f"a.r{i}", "ready", "auto", (1, 2), "", W8B, None, residual={0: RESIDUAL_GUESS}) for i in (1, 2)]
    steps = plan_switch("b", None, holders, host(100), gpu=room)
    assert [s.act for s in steps] == [SLEEP, STOP, START]  # 141 - 3 = 138 ≥ 136 asleep; 138 - 3 = 135 < 136 stopped


# --- which sleeping model to stop when memory runs short ------------------------------------------

def test_the_longest_asleep_that_holds_what_is_short_goes_first():
    sleepers = [Sleeper("x", 1, 0, {0: 2 * GiB}, since=10.0), Sleeper("y", 1, 0, {0: 2 * GiB}, since=5.0),
                Sleeper("z", 1, 0, {1: 9 * GiB}, since=1.0)]
    assert to_stop({0: 1 * GiB}, 0, sleepers) == ["y"]
    assert to_stop({0: 3 * GiB}, 0, sleepers) == ["y", "x"]  # z holds nothing on GPU 0: left asleep


def test_nothing_is_stopped_when_stopping_every_sleeper_would_not_be_enough():
    sleepers = [Sleeper("x", 1, 0, {0: 2 * GiB}, since=1.0)]
    assert to_stop({0: 3 * GiB}, 0, sleepers) == []


def test_host_memory_short_stops_a_level_1_sleeper_and_not_a_level_2_one():
    sleepers = [Sleeper("l2", 2, 0, {}, since=1.0), Sleeper("l1", 1, W8B, {}, since=2.0)]
    assert to_stop({}, 10 * GiB, sleepers) == ["l1"]


def test_the_model_being_started_is_never_chosen_and_nothing_short_stops_nothing():
    sleepers = [Sleeper("a", 1, 0, {0: 5 * GiB}, since=1.0), Sleeper("b", 1, 0, {0: 5 * GiB}, since=2.0)]
    assert to_stop({0: 1 * GiB}, 0, sleepers, keep=["a"]) == ["b"]
    assert to_stop({0: 0}, 0, sleepers) == [] and to_stop({}, -5, sleepers) == []
