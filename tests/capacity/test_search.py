"""The capacity search's decisions (campaign/search.py), driven by plain functions of the load: each
test says which loads pass before the search runs, and checks what the search made of them."""

from __future__ import annotations

from typing import Callable

from servedeck.workloads.search import Resolution, Search, SearchOptions


def point(passed: bool, ttft_ms: float = 100.0, binding: str = "ttft_p95", client_bound: bool = False) -> dict:
    return {"passed": passed, "binding": binding, "missed": [] if passed else [binding],
            "ttft_p50_ms": ttft_ms, "client_bound": client_bound, "client_reasons": ["lag"] if client_bound else [],
            "thresholds": [{"key": binding, "value": ttft_ms, "passed": passed}]}


def run(measure: Callable[[float, int], dict], **opts) -> dict:
    """Drive a search; `measure(load, n)` gets how many times this load was measured before."""
    o = dict(start=1, cap=512, cap_reason="--max 512", resolution=Resolution(0.1))
    o.update(opts)
    s = Search(SearchOptions(**o))
    seen: dict[float, int] = {}
    while (load := s.next_load()) is not None:
        s.tell(load, measure(load, seen.get(load, 0)))
        seen[load] = seen.get(load, 0) + 1
    return s.result()


def below(boundary: float) -> Callable[[float, int], dict]:
    return lambda load, n: point(load <= boundary)


def test_finds_a_boundary_within_the_resolution():
    r = run(below(37))
    lo, hi = r["boundary"]["max_passing"], r["boundary"]["min_failing"]
    assert r["verdict"] == "found"
    assert lo <= 37 < hi
    assert hi - lo <= 0.1 * hi


def test_brackets_by_doubling_before_it_bisects():
    r = run(below(37))
    bracket = [s["load"] for s in r["steps"] if s["phase"] == "bracket"]
    assert bracket == [1, 2, 4, 8, 16, 32, 64]


def test_the_boundary_is_measured_twice_on_each_side():
    r = run(below(37))
    loads = [s["load"] for s in r["steps"]]
    assert loads.count(r["boundary"]["max_passing"]) == 2
    assert loads.count(r["boundary"]["min_failing"]) == 2


def test_integer_loads_stop_at_adjacent_values():
    r = run(below(5), resolution=Resolution(absolute=0.0))
    assert (r["boundary"]["max_passing"], r["boundary"]["min_failing"]) == (5, 6)


def test_fails_at_the_smallest_load_is_said_plainly():
    r = run(lambda load, n: point(False))
    assert r["verdict"] == "fails at smallest load"
    assert r["capacity"] is None
    assert any("fails already at the smallest load" in n for n in r["notes"])


def test_a_load_that_always_passes_stops_at_the_cap():
    r = run(lambda load, n: point(True), cap=16, cap_reason="the engine's 16 slots")
    assert r["verdict"] == "capped" and r["capacity"] == 16
    assert any("the engine's 16 slots" in n for n in r["notes"])


def test_a_lucky_pass_does_not_hold_the_boundary():
    # the true boundary is 16; 20 passes only the first time it is measured
    r = run(lambda load, n: point(load <= 16 or (load == 20 and n == 0)))
    assert r["capacity"] <= 16
    assert any("c=20 passed at first and fails on re-measure" in n for n in r["notes"])


def test_an_unlucky_failure_is_re_measured_and_the_search_widens_above_it():
    # the true boundary is 40; 32 (a doubling step) fails only the first time it is measured
    r = run(lambda load, n: point(load <= 40 and not (load == 32 and n == 0)))
    assert r["boundary"]["unstable"] == [32]
    assert any(s["phase"] == "widen" for s in r["steps"])
    assert 36 <= r["capacity"] <= 40
    assert any("c=32 failed at first and passes on re-measure" in n for n in r["notes"])


def test_a_load_client_bound_twice_ends_the_search_as_no_result():
    r = run(lambda load, n: point(True, client_bound=load >= 8))
    assert r["verdict"] == "client-bound"
    assert r["capacity"] == 4
    assert [(s["load"], s["phase"]) for s in r["steps"] if s["judged"]["client_bound"]] == [(8, "bracket"), (8, "retry")]


def test_a_load_client_bound_once_is_measured_again_and_the_search_goes_on():
    # c=2's first measurement is client-bound (a passing spike on the box), its second is not.
    r = run(lambda load, n: point(load <= 37, client_bound=(load == 2 and n == 0)))
    assert r["verdict"] == "found"
    assert r["boundary"]["max_passing"] <= 37 < r["boundary"]["min_failing"]
    assert [s["phase"] for s in r["steps"][:3]] == ["bracket", "bracket", "retry"]
    assert any("c=2: the client, not the server, set the pace" in n and "measured again" in n for n in r["notes"])


def test_binding_constraint_comes_from_the_first_failing_point():
    r = run(lambda load, n: point(load <= 10, binding="ttft_p95" if load <= 10 else "tpot_p95"))
    assert r["binding"] == "tpot_p95"


def test_ttft_jump_across_the_boundary_is_a_cliff():
    r = run(lambda load, n: point(load <= 10, ttft_ms=100.0 if load <= 10 else 900.0))
    assert r["shape"]["kind"] == "cliff"


def test_gradual_ttft_rise_is_smooth():
    r = run(lambda load, n: point(load <= 10, ttft_ms=100.0 + load))
    assert r["shape"]["kind"] == "smooth"


def test_rate_search_is_not_held_to_whole_numbers():
    r = run(lambda load, n: point(load <= 3.3), start=0.5, integer=False, cap=64)
    assert 3.3 - 0.1 * r["boundary"]["min_failing"] <= r["capacity"] <= 3.3


def test_the_step_budget_bounds_the_search():
    r = run(below(37), max_steps=5)
    assert len(r["steps"]) == 5 and r["verdict"] == "step budget spent"


def test_unstable_loads_up_to_the_cap_end_the_search():
    # seen on a busy llama-server: c=1 always passes; c=2 and c=4 (the cap) pass some times, fail others
    flips = {2: [False, True], 4: [True, False, True, True]}
    r = run(lambda load, n: point(load == 1 or flips[int(load)][n % len(flips[int(load)])]), cap=4,
            cap_reason="the engine's 4 slots")
    assert r["verdict"] == "unstable above" and r["capacity"] == 1
    assert len(r["steps"]) <= 6


def test_a_smallest_load_that_passed_and_failed_ends_the_search_instead_of_re_measuring_it_to_the_budget():
    # seen in a llama.cpp tune on this box (2026-12-06, 19:17): c=1 passed, c=2 failed, c=1 failed on re-measure
    # (a TTFT p90 of 1.55 s against 1 s while other work held the cores), c=2 passed on re-measure; every later
    # c=1 passed, and the search measured c=1 again 25 times until its 30 steps were spent
    flips = {1: [True, False, True], 2: [False, True]}
    r = run(lambda load, n: point(flips[int(load)][min(n, len(flips[int(load)]) - 1)] if load <= 2 else False),
            max_steps=30)
    assert r["verdict"] == "unstable at smallest load"
    assert r["capacity"] is None
    assert len(r["steps"]) <= 5
    assert any("c=1 passed 1 of 2 times" in n and "no load passed every time" in n for n in r["notes"])


def rising(limit_at: float, power: float = 1.0, key: str = "ttft_p90") -> Callable[[float, int], dict]:
    """A figure whose share of its limit is (load / limit_at) ** power: it meets the limit at `limit_at`."""
    def measure(load: float, n: int) -> dict:
        share = (load / limit_at) ** power
        return {"passed": share <= 1, "binding": key, "missed": [] if share <= 1 else [key],
                "ttft_p50_ms": 100.0 * share, "client_bound": False, "client_reasons": [],
                "thresholds": [{"key": key, "value": 1000.0 * share, "limit": 1000.0, "ratio": share,
                                "passed": share <= 1}]}
    return measure


def test_a_rising_figure_is_bracketed_short_of_doubling_and_narrowed_where_it_meets_its_limit():
    # the trend through c=4 and c=8 reaches the limit at 8.5: the bracket steps to 10 (one 10 % step past
    # it), not 16; false position between 8 and 10 picks 9; then both ends are measured again
    r = run(rising(8.5), cap=16, cap_reason="the engine's 16 slots")
    assert [s["load"] for s in r["steps"]] == [1, 2, 4, 8, 10, 9, 8, 9]
    assert (r["verdict"], r["capacity"], r["boundary"]["min_failing"]) == ("found", 8, 9)
    assert "reaches it near 8.5" in r["steps"][4]["why"] and "short of doubling to 16" in r["steps"][4]["why"]
    assert "meets it" in r["steps"][5]["why"]
    # what the grid-against-search bench counts: a closed loop's requests grow with its load
    assert sum(s["load"] for s in r["steps"]) <= 0.4 * sum(range(1, 17))


def test_false_position_that_creeps_from_one_end_falls_back_to_the_middle():
    # a steep convex figure: false position between a far-apart pair lands low again and again
    r = run(rising(37, power=4.0))
    lo, hi = r["boundary"]["max_passing"], r["boundary"]["min_failing"]
    assert r["verdict"] == "found" and lo <= 37 < hi and hi - lo <= 0.1 * hi
    assert any("the middle (the last two steps fell on the same side)" in s["why"] for s in r["steps"])


def test_a_figure_far_below_its_limit_leaves_plain_doubling():
    flat = lambda load, n: {**rising(1e9)(load, n), "passed": load <= 20}  # noqa: E731
    r = run(flat)
    assert [s["load"] for s in r["steps"] if s["phase"] == "bracket"] == [1, 2, 4, 8, 16, 32]


def test_a_rate_search_is_guided_too():
    r = run(rising(3.3), start=0.5, integer=False, cap=64)
    assert 3.3 - 0.1 * r["boundary"]["min_failing"] <= r["capacity"] <= 3.3
    assert len(r["steps"]) <= 9


def test_a_step_whose_streams_each_sent_few_requests_is_said_to_be_coarse_once():
    # the H100 tune of 2026-12-07: c=128 for 4 s sent 512 requests (4 a stream) in a 4.48 s window at one launch
    def measure(load, n):
        return {**point(load <= 150), "measured": int(load) * 4, "window_s": 4.48}
    r = run(measure, start=32)
    coarse = [n for n in r["notes"] if "a stream in its" in n]
    assert coarse == ["c=32: 4 requests a stream in its 4.5 s window, so its good req/s moves in steps of 7.14 (one "
                      "request more or fewer a stream): figures that close are not told apart; a `duration` that "
                      "lets each stream send 8 or more would"]


def test_streams_that_sent_enough_or_an_open_loop_say_nothing_of_it():
    r = run(lambda load, n: {**point(load <= 150), "measured": int(load) * 8, "window_s": 20.0}, start=32)
    assert not [n for n in r["notes"] if "a stream" in n]
    r = run(lambda load, n: {**point(load <= 150), "measured": 3, "window_s": 4.0}, start=32, integer=False)
    assert not [n for n in r["notes"] if "a stream" in n]


# --- a floor (a campaign's stop_below, the tune's best so far) -------------------------------------------

def rated(load: float, boundary: float, per_stream: float = 0.5) -> dict:
    """A closed-loop point whose streams each complete `per_stream` requests a second (throughput c × that, all
    of them good where the load passes), in a 10-s window."""
    passed = load <= boundary
    done = int(load * per_stream * 10)
    return {**point(passed), "measured": done, "failed_requests": 0, "window_s": 10.0,
            "goodput_request_s": done / 10 if passed else 0.0}


def test_a_search_stops_at_its_first_failing_load_once_it_cannot_carry_its_floor():
    # boundary 37, half a request a second a stream: 64 (the first failing load) completes 32 a second, so no load
    # below it carries more than 32, under a floor of 40: stopped there, nothing bisected or measured again
    r = run(lambda load, n: rated(load, 37), floor=40.0)
    assert r["verdict"] == "below floor"
    assert [s["load"] for s in r["steps"]] == [1, 2, 4, 8, 16, 32, 64]
    assert r["capacity"] == 32 and r["boundary"]["min_failing"] == 64
    assert r["below_floor"] == {"floor": 40.0, "ceiling": 32.0, "at": 64,
                                "from": "the requests completed a second at c=64, which failed"}
    assert any(n.startswith("below its floor: no load below c=64 can carry more than 32 good req/s") for n in r["notes"])


def test_a_floor_the_search_can_still_reach_changes_nothing():
    # the answer is 18.5 (c=37); every failing load above it completes more than 18 a second
    free = run(lambda load, n: rated(load, 37))
    held = run(lambda load, n: rated(load, 37), floor=18.0)
    assert held["verdict"] == free["verdict"] == "found"
    assert [s["load"] for s in held["steps"]] == [s["load"] for s in free["steps"]]
    assert held["below_floor"] is None and held["floor"] == 18.0


def test_the_ceiling_tightens_as_the_boundary_narrows():
    # 64 completes 32 a second, above a floor of 25; bisecting, a lower failing load (40: 20 a second) is below it
    r = run(lambda load, n: rated(load, 37), floor=25.0)
    assert r["verdict"] == "below floor"
    loads = [s["load"] for s in r["steps"]]
    assert loads[:7] == [1, 2, 4, 8, 16, 32, 64] and len(loads) > 7
    assert r["below_floor"]["at"] == r["boundary"]["min_failing"] < 64
    assert r["below_floor"]["ceiling"] == r["boundary"]["min_failing"] / 2 < 25


def test_a_floor_is_not_judged_before_a_load_has_failed():
    # every load passes (capped at 16, 8 a second there): however high the floor, the search ends as it would
    r = run(lambda load, n: rated(load, 1000), cap=16, cap_reason="the engine's 16 slots", floor=1000.0)
    assert r["verdict"] == "capped" and r["below_floor"] is None


def test_a_passing_load_that_carried_more_than_the_failing_one_sets_the_ceiling():
    # the failing load's window completed fewer than the passing one's good requests (a collapse past the
    # boundary): the answer could be that passing load's figure, so the ceiling is the larger of the two
    def measure(load: float, n: int) -> dict:
        judged = rated(load, 37)
        return {**judged, "measured": 5} if load == 64 else judged

    r = run(measure, floor=17.0)
    assert r["verdict"] == "below floor" and r["below_floor"]["ceiling"] == 16.0
    assert r["below_floor"]["from"] == "the good req/s at c=32, which passed"
    assert run(measure, floor=16.0)["verdict"] == "found"  # 16 could still be carried: not below it


def test_a_client_bound_failure_sets_no_ceiling():
    # 64 fails client-bound twice: no verdict, so nothing bounds the search and the floor is not judged
    def measure(load: float, n: int) -> dict:
        return {**rated(load, 37), "client_bound": True, "client_reasons": ["lag"]} if load == 64 else rated(load, 37)

    r = run(measure, floor=1000.0)
    assert r["verdict"] == "client-bound" and r["below_floor"] is None
