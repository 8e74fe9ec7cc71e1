"""A trial's verdict and what the search is told, and the best by the verdict rules, pure. Each case was written
from what a user should read before the code: a bound is its value marked, a trial whose answers changed or
whose gate failed is pruned (a bad region), a config that breaks a rule or cannot fit is never launched."""

from __future__ import annotations

from servedeck.tune import objective as O

DONE = {"state": "done"}


def row(good, *, bound=False, capacity=4.0, result=True, slo="chat", steps=None):
    return {"slo": slo, "slo_text": "ttft_p90<=2s", "variant": "x", "find": "max-concurrency", "capacity": capacity,
            "capacity_per_gpu": capacity, "bound": bound, "steps": steps or (["a higher `max`"] if bound else []),
            "goodput_per_gpu": good, "goodputs_per_gpu": [good] if good is not None else [],
            "output_tok_s_per_gpu": (good or 0) * 30, "goodput_interval": None, "repeats": 1,
            "result": result, "gate": "passed" if result else "failed"}


def same():
    return O.outputs_check({"verdict": "identical", "identical": 2, "prompts": 2}, False)


def test_a_measured_trial_tells_its_goodput():
    v = O.judge(DONE, row(1.5), same())
    assert (v.verdict, v.tell, v.value, v.bound) == ("measured", "complete", 1.5, False)


def test_a_bound_counts_as_its_value_and_is_marked_with_the_step_that_would_pin_it():
    v = O.judge(DONE, row(2.0, bound=True), same())
    assert (v.verdict, v.value, v.bound) == ("measured", 2.0, True)
    assert "a higher `max`" in v.why


def test_no_load_within_the_slo_is_a_figure_of_zero():
    v = O.judge(DONE, row(None, capacity=None), same())
    assert (v.verdict, v.tell, v.value) == ("no-capacity", "complete", 0.0)


def test_a_failed_gate_is_pruned():
    v = O.judge(DONE, row(3.0, result=False), same())
    assert (v.verdict, v.tell) == ("gate-failed", "pruned")


def test_changed_outputs_are_pruned_unless_the_space_allows_them():
    differs = {"verdict": "differs", "identical": 1, "prompts": 2}
    v = O.judge(DONE, row(3.0), O.outputs_check(differs, False))
    assert (v.verdict, v.tell) == ("outputs-differ", "pruned") and "1/2 prompts identical" in v.why
    allowed = O.judge(DONE, row(3.0), O.outputs_check(differs, True))
    assert (allowed.verdict, allowed.value) == ("measured", 3.0)


def test_a_trial_stopped_at_its_output_check_is_refused_for_its_answers_not_its_missing_figure():
    differs = O.outputs_check({"verdict": "differs", "identical": 5, "prompts": 8}, False)
    stopped = {"state": "failed", "reason": "greedy outputs differ from R's (campaign.reference_run): …",
               "stopped_by": "reference_run"}
    v = O.judge(stopped, None, differs)
    assert (v.verdict, v.tell) == ("outputs-differ", "pruned")
    assert "5/8 prompts identical); stopped there, before its capacity search" in v.why
    assert "stopped there" not in O.judge(DONE, row(3.0), differs).why  # measured in full: nothing was stopped
    # on Ray the node's ending keeps its reason alone, not the local record's stopped_by
    assert "stopped there" in O.judge({"state": "failed", "reason": "… (campaign.reference_run) …"}, None, differs).why
    crashed = O.judge({"state": "failed", "reason": "the server died"}, None, differs)
    assert crashed.verdict == "outputs-differ" and "its cell then failed: the server died" in crashed.why


def test_a_search_stopped_below_the_best_is_pruned_naming_what_it_was_held_to():
    stopped = {**row(0.9, bound=True, steps=["a search without `stop_below`"]), "ceiling_per_gpu": 1.2}
    v = O.judge(DONE, stopped, same(), {"value": 1.5, "trial": "starter"})
    assert (v.verdict, v.tell, v.value) == ("below-best", "pruned", None)
    assert "no load could carry more than 1.2 good req/s per GPU, below the best so far, 1.5 (starter's)" in v.why
    assert O.judge(DONE, row(1.6), same(), {"value": 1.5, "trial": "starter"}).verdict == "measured"


def test_a_trial_stopped_below_the_best_leaves_the_leader_decided():
    # its figure is a bound, but one with a ceiling under the leader's: it cannot exceed it
    stopped = {"trial": "t2", "outputs": same(),
               "row": {**row(0.9, bound=True, steps=["a search without `stop_below`"]), "ceiling_per_gpu": 1.2}}
    best = O.best([_trial("starter", 1.5), stopped], "chat")
    assert (best["verdict"], best["best"], best["next"]) == ("recommended", "starter", "t2")


def test_a_cell_that_failed_or_timed_out_is_pruned_with_its_reason():
    v = O.judge({"state": "failed", "reason": "llama-server exited with 1"}, None, None)
    assert (v.verdict, v.tell) == ("failed", "pruned") and "exited with 1" in v.why
    assert O.judge({"state": "timed-out", "reason": "cell_timeout"}, None, None).tell == "pruned"


def test_an_interrupted_cell_tells_the_search_nothing():
    assert O.judge({"state": "pending", "reason": "Ctrl-C"}, None, None).tell is None


def test_a_broken_rule_or_no_room_is_never_launched():
    assert O.before_launch([], [{"status": "unknown"}, {"status": "fits"}]) is None  # a CPU host launches
    rule = O.before_launch(["args.ubatch-size <= args.batch-size"], [])
    assert (rule.verdict, rule.tell) == ("broke-rule", "pruned")
    room = O.before_launch([], [{"status": "no-room", "message": "m@t1 does not fit: GPU 0 needs 90 GiB"}])
    assert (room.verdict, room.tell) == ("no-fit", "pruned") and "does not fit" in room.why


def _trial(name, good, **kw):
    outputs = kw.pop("outputs", same())
    return {"trial": name, "row": row(good, **kw), "outputs": outputs}


def test_the_best_is_the_recommendation_over_the_trials():
    best = O.best([_trial("starter", 1.0), _trial("t1", 2.0), _trial("t2", 1.5)], "chat")
    assert (best["verdict"], best["best"], best["next"]) == ("recommended", "t1", "t2")


def test_a_bound_below_the_leader_leaves_it_undecided():
    best = O.best([_trial("t1", 2.0), _trial("t2", 1.0, bound=True)], "chat")
    assert (best["verdict"], best["leading"]) == ("undecided", "t1")
    assert best["undecided"][0]["variant"] == "t2"


def test_a_trial_with_changed_outputs_never_leads():
    differs = O.outputs_check({"verdict": "differs", "identical": 0, "prompts": 2}, False)
    best = O.best([_trial("t1", 5.0, outputs=differs), _trial("t2", 1.0)], "chat")
    assert best["best"] == "t2" and best["left_out"][0]["variant"] == "t1"


def test_before_any_figure_there_is_no_best():
    assert O.best([{"trial": "t1", "row": None}], "chat")["verdict"] == "none"


def test_the_budget_counts_finished_trials_and_spent_time():
    assert O.trials_left(2, 3, 0, None) and not O.trials_left(3, 3, 0, None)
    assert O.trials_left(0, None, 10, 60) and not O.trials_left(0, None, 60, 60)
    assert not O.trials_left(1, 5, 61, 60)


def test_proposals_refused_before_a_launch_do_not_spend_the_trial_budget():
    # a llama.cpp tune here (2026-12-06, `trials = 8`, `require = ["args.ubatch-size <= args.batch-size"]`) spent
    # 2 of its 8 trials on proposals that broke the rule and were never launched: 6 launches searched, not 8
    seen = ["measured", "broke-rule", "measured", "outputs-differ", "broke-rule", "measured", "measured", "measured"]
    assert O.counted(seen) == 6
    assert O.counted(["no-fit", "invalid", "failed", "gate-failed", "no-capacity"]) == 3


def test_a_space_whose_rules_refuse_nearly_everything_still_ends():
    many = ["broke-rule"] * (O.FREE_UNLAUNCHED + 3)
    assert O.counted(many) == 3
    assert not O.trials_left(O.counted(many + ["measured"] * 5), 8, 0.0, None)


def _done(trial, values, verdict, tell, value=None, bound=False):
    return {"trial": trial, "values": values, "state": "done", "verdict": verdict, "tell": tell, "value": value,
            "bound": bound}


def test_values_already_tried_are_not_launched_again():
    # on an H100 (2026-12-07) a search of 4 points drew the starter's values for t2 and launched them: 83.00 then
    # 110.77 good req/s for the same flags, and t2 became the search's best
    starter = _done("starter", {"args.max-num-seqs": 256, "args.max-num-batched-tokens": 8192}, "measured",
                    "complete", 83.0)
    t1 = _done("t1", {"args.max-num-seqs": 256, "args.max-num-batched-tokens": 2048}, "measured", "complete", 106.58,
               bound=True)
    again = O.repeat_of({"args.max-num-batched-tokens": 8192, "args.max-num-seqs": 256}, [starter, t1])
    assert again is not None and (again.verdict, again.tell, again.value) == ("repeated", "complete", 83.0)
    assert "starter" in again.why and "not launched" in again.why
    of_t1 = O.repeat_of(dict(t1["values"]), [starter, t1])
    assert of_t1 is not None and of_t1.value == 106.58 and of_t1.bound and "t1" in of_t1.why
    assert O.repeat_of({"args.max-num-seqs": 64, "args.max-num-batched-tokens": 8192}, [starter, t1]) is None
    assert O.counted(["measured", "repeated", "measured"]) == 2  # free, as proposals refused before a launch


def test_a_repeat_of_a_pruned_trial_is_pruned_and_of_an_unlaunched_or_cut_one_is_launched():
    differ = _done("t3", {"a": 1}, "outputs-differ", "pruned")
    again = O.repeat_of({"a": 1}, [differ])
    assert again is not None and again.tell == "pruned" and again.value is None and "outputs-differ" in again.why
    assert O.repeat_of({"a": 2}, [_done("t4", {"a": 2}, "interrupted", None)]) is None
    assert O.repeat_of({"a": 3}, [_done("t5", {"a": 3}, "broke-rule", "pruned")]) is None
    assert O.repeat_of({"a": 4}, [_done("starter", None, "measured", "complete", 1.0)]) is None  # point unknown
