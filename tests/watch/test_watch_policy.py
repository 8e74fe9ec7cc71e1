"""The watch loop's relaunch policy (watch/policy.py), decided without processes or clocks: `now` is
given, in seconds on the loop's monotonic clock. Settings as models.toml's [host] defaults spell them
(3 tries, 60 s apart), so the times below are the ones a user would see."""

from __future__ import annotations

from servedeck.watch import policy as W
from servedeck.watch.policy import Incident, Settings

S = Settings(tries=3, spacing_s=60.0)
T0 = 1000.0  # the monotonic clock's reading when the model is first found absent
FAILED = {"outcome": "failed to start", "detail": "llama-server exited 1 while starting",
          "cause": {"summary": "unknown argument: --no-such-flag"}, "launch_dir": "/l/1", "log_tail": ["error"]}


def fail_try(inc: Incident, now: float) -> tuple[Incident, W.Action]:
    inc, act = W.absent(inc, S, now)
    assert act.kind == W.RELAUNCH, act
    return W.tried(inc, S, now, FAILED)


def test_a_wanted_model_not_running_is_relaunched_at_once_as_try_1_of_n():
    inc, act = W.absent(Incident(since="2026-12-01T10:00:00+00:00"), S, T0)
    assert act == W.Action(W.RELAUNCH, attempt=1, of=3)
    assert inc.tries == 1


def test_after_a_failed_try_the_next_waits_the_spacing():
    inc, after = fail_try(Incident(), T0)
    assert after == W.Action(W.WAIT, until=T0 + 60.0)
    inc, act = W.absent(inc, S, T0 + 59.9)
    assert act == W.Action(W.WAIT, until=T0 + 60.0)


def test_the_next_try_comes_once_the_spacing_has_passed():
    inc, _ = fail_try(Incident(), T0)
    _, act = W.absent(inc, S, T0 + 60.0)
    assert act == W.Action(W.RELAUNCH, attempt=2, of=3)


def test_every_failed_try_keeps_its_evidence_under_its_number():
    inc, _ = fail_try(Incident(), T0)
    inc, _ = fail_try(inc, T0 + 60)
    assert [e["try"] for e in inc.evidence] == [1, 2]


def test_the_nth_failed_try_gives_up():
    inc, _ = fail_try(Incident(), T0)
    inc, _ = fail_try(inc, T0 + 60)
    inc, act = fail_try(inc, T0 + 120)
    assert act == W.Action(W.GIVE_UP)


def test_giving_up_says_after_how_many_tries_and_the_last_cause():
    inc, _ = fail_try(Incident(), T0)
    inc, _ = fail_try(inc, T0 + 60)
    inc, _ = fail_try(inc, T0 + 120)
    gave = W.give_up(inc, "2026-12-01T10:02:00+00:00")
    assert gave.state == W.GAVE_UP
    assert gave.detail == "gave up after 3 relaunch tries: unknown argument: --no-such-flag"
    assert gave.cause == FAILED["cause"]


def test_a_model_given_up_on_is_not_tried_again_however_long_it_waits():
    inc, _ = fail_try(Incident(), T0)
    gave = W.give_up(inc, "x")
    _, act = W.absent(gave, S, T0 + 86_400)
    assert act.kind == W.NOTHING


def test_a_crash_after_a_relaunch_counts_toward_the_same_tries():
    inc, _ = W.absent(Incident(), S, T0)
    inc, _ = W.tried(inc, S, T0 + 5)  # up and ready
    inc = W.crashed(inc, "crashed", {"detail": "killed by SIGKILL"}, since="x")
    assert inc.evidence[-1]["try"] == 1 and inc.evidence[-1]["outcome"] == "crashed after relaunch"


def test_a_crash_loop_ends_given_up_rather_than_relaunched_forever():
    inc = Incident()
    now = T0
    for _ in range(3):  # each relaunch comes up, then crashes before the stable window
        inc, act = W.absent(inc, S, now)
        assert act.kind == W.RELAUNCH
        inc, _ = W.tried(inc, S, now)
        inc = W.crashed(inc, "crashed", {"detail": "killed by SIGKILL"}, since="x")
        now += 60
    _, act = W.absent(inc, S, now)
    assert act == W.Action(W.GIVE_UP)


def test_a_crash_clears_the_stable_clock():
    inc, _ = W.absent(Incident(), S, T0)
    inc, _ = W.tried(inc, S, T0)
    inc = W.crashed(inc, "crashed", {"detail": "killed"}, since="x")
    assert inc.ready_at is None


def test_a_crash_out_of_the_blue_opens_an_incident_with_try_0():
    inc = W.crashed(None, "crashed", {"detail": "killed by SIGKILL"}, since="2026-12-01T10:00:00+00:00")
    assert (inc.state, inc.tries, [e["try"] for e in inc.evidence]) == (W.RELAUNCHING, 0, [0])


def test_a_relaunched_model_up_less_than_the_stable_window_keeps_its_incident():
    inc, _ = W.absent(Incident(), S, T0)
    inc, _ = W.tried(inc, S, T0)
    kept, act = W.running(inc, S, T0 + S.stable_s - 0.1)
    assert kept is inc and act.kind == W.NOTHING


def test_a_relaunched_model_up_for_the_stable_window_closes_its_incident():
    inc, _ = W.absent(Incident(), S, T0)
    inc, _ = W.tried(inc, S, T0)
    assert W.running(inc, S, T0 + 180.0) == (None, W.Action(W.STABLE))  # 60 s × 3 tries


def test_after_the_stable_window_the_count_starts_again_at_try_1():
    inc, _ = W.absent(Incident(), S, T0)
    inc, _ = W.tried(inc, S, T0)
    closed, _ = W.running(inc, S, T0 + 180.0)
    _, act = W.absent(closed or Incident(), S, T0 + 200.0)
    assert act == W.Action(W.RELAUNCH, attempt=1, of=3)


def test_a_model_given_up_on_that_runs_again_is_watched_again():
    gave = W.give_up(fail_try(Incident(), T0)[0], "x")
    assert W.running(gave, S, T0 + 1) == (None, W.Action(W.RESUMED))


def test_with_no_tries_the_loop_says_once_that_it_leaves_the_model():
    none = Settings(tries=0, spacing_s=60.0)
    inc, first = W.absent(Incident(), none, T0)
    _, second = W.absent(inc, none, T0 + 1)
    assert (first.kind, second.kind) == (W.TELL_ABSENT, W.NOTHING)


def test_a_restarted_loop_keeps_the_time_left_before_the_next_try():
    """watch.json keeps epoch seconds; a loop started later (another monotonic reading of the same
    wall time) must still wait what is left of the spacing."""
    inc, _ = fail_try(Incident(), T0)  # next try at T0 + 60 on this loop's clock
    saved = inc.to_json(wall_minus_mono=1.7e9)
    later = Incident.from_json(saved, wall_minus_mono=1.7e9 - 5000.0)  # a clock 5000 s further on
    assert later.next_at == T0 + 60 + 5000.0


def test_a_next_try_saved_before_a_reboot_does_not_hold_the_model_back():
    inc, _ = fail_try(Incident(), T0)
    saved = inc.to_json(wall_minus_mono=1.7e9)
    after_reboot = Incident.from_json(saved, wall_minus_mono=1.7e9 + T0 + 3600)  # monotonic restarted at 0
    _, act = W.absent(after_reboot, S, 10.0)
    assert act.kind == W.RELAUNCH


def test_a_given_up_incident_survives_watch_json():
    gave = W.give_up(fail_try(Incident(since="s"), T0)[0], "2026-12-01T10:00:00+00:00")
    assert Incident.from_json(gave.to_json(1.7e9), 1.7e9) == gave
