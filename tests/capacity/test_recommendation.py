"""The recommendation's decisions, pure (no engine, no files): which variant carries the most good requests/s
among those whose gate passed, by how much, and the interval its repeats give (the ranking rules on bounds,
goodput and outputs: tests/report/test_verdict_rules.py). Here each capacity carried as many good
requests/s as its concurrency, so the arithmetic below reads either way. Each view is what runs.read.load
gives of a capacity run, cut to the keys report/capacity.py reads.

Welch intervals worked by hand (t quantiles from a table):
    best [4, 6] against [2, 2]: difference 3, standard error 1, 1 degree of freedom, t = 12.706:
        3 ± 12.706 = [-9.706, 15.706], over 2: [-485 %, +785 %], change +150 %.
    best [10, 11, 12] against [4, 5, 6]: difference 6, standard error sqrt(1/3 + 1/3) = 0.8165, 4 degrees
        of freedom, t = 2.776: 6 ± 2.267 = [3.733, 8.267], over 5: [+75 %, +165 %], change +120 %.
"""

from __future__ import annotations

from servedeck.report.capacity import campaign_section, capacity_rows, recommendations


def _view(variant: str, capacity: float, gate: str = "passed") -> dict:
    return {"run": f"{variant}-{capacity}", "gpus_used": 0, "campaign": {"variant": variant},
            "gate": {"status": gate}, "points": [],
            "capacity": {"find": "max-concurrency", "slo": "chat", "slo_text": "ttft_p95<=2s", "capacity": capacity,
                         "verdict": "found", "binding": "ttft_p95", "point": 0,
                         "goodput_request_s": capacity}}


def _rec(views: list[dict]) -> dict:
    (rec,) = recommendations(capacity_rows(views))
    return rec


def _carrying(views: list[dict]) -> str:
    md = "\n".join(campaign_section(capacity_rows(views))).splitlines()
    rows = md[md.index("### Recommendation") + 4:]
    row = next(r for r in rows if r.startswith("| chat"))
    return row.strip("|").split(" | ")[2].strip()


def test_repeats_with_a_spread_give_the_welch_interval_of_the_change():
    views = [_view("a", 4), _view("a", 6), _view("b", 2), _view("b", 2)]
    assert _carrying(views) == ("5.00 [-7.706, 17.71] good req/s per launch (CPU) at c=5, +150% [-485%, +785%] (95 %, "
                                "repeats, Welch t) over b (2.00); the interval includes no difference: not "
                                "distinguishable from noise")


def test_a_change_whose_interval_excludes_zero_is_not_called_noise():
    views = [_view("a", x) for x in (10, 11, 12)] + [_view("b", x) for x in (4, 5, 6)]
    ci = _rec(views)["by_interval"]
    assert (round(ci["lo"], 3), round(ci["hi"], 3)) == (0.747, 1.653)


def test_the_interval_is_said_in_the_table_for_a_real_difference():
    views = [_view("a", x) for x in (10, 11, 12)] + [_view("b", x) for x in (4, 5, 6)]
    assert "+120% [+75%, +165%] (95 %, repeats, Welch t) over b (5.00)" in _carrying(views)


def test_one_launch_a_side_gives_no_interval_and_says_why():
    views = [_view("a", 4), _view("b", 2), _view("b", 2)]
    assert _carrying(views).endswith("+100% over b (2.00); no interval: one capacity found for a "
                                     "(campaign repeats = 2 or more gives one)")


def test_a_failed_gate_is_not_recommended_even_when_it_carries_the_most():
    views = [_view("broken", 16, "failed"), _view("a", 4), _view("b", 2)]
    assert _rec(views)["best"] == "a"


def test_the_left_out_variant_is_named_with_its_gate():
    views = [_view("broken", 16, "failed"), _view("a", 4), _view("b", 2)]
    assert [(x["variant"], x["why"]) for x in _rec(views)["left_out"]] == [("broken", "gate failed: not a result")]


def test_a_gate_that_never_ran_is_not_a_result_either():
    views = [_view("ungated", 8, "not run"), _view("a", 4)]
    assert _rec(views)["best"] == "a"


def test_no_recommendation_when_no_gate_passed():
    views = [_view("a", 8, "failed"), _view("b", 4, "not run")]
    assert _rec(views)["best"] is None


def test_a_variant_with_one_failed_repeat_gate_is_not_a_result():
    views = [_view("a", 8), _view("a", 8, "failed"), _view("b", 4)]
    assert _rec(views)["best"] == "b"
