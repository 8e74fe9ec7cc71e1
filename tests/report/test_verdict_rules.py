"""The recommendation's ranking rules, pure (no engine, no processes): what a variant carries within the SLO
per GPU (goodput, requests/s) decides, not the concurrency it took; a capacity a search did not pin down (its
verdict client-bound, capped, unstable above, step budget spent, or a search cut short) is a lower bound and
is compared as one, "undecided" where bounds decide nothing, naming the step that would decide; a variant
whose greedy outputs differ from the reference variant's is not recommended unless its campaign entry says
`outputs_may_differ = true`, and the table says which it is either way.

Each case was chosen before the code that answers it (issue 47): the figures in the last ones are the
2026-12-06 H100 campaign's (plain SmolLM2 client-bound at c=16 carrying 52.57 good requests/s, ngram capped
at c=32 carrying 30.15, and ngram's outputs differing from plain's in 6 of 8 prompts).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from servedeck.campaign.file import parse
from servedeck.errors import ConfigError
from servedeck.report.capacity import campaign_section, capacity_rows, compare_capacity, recommendations, run_section
from servedeck.report.recommend import outputs_of, pair


def _view(variant: str, c: float, good: float, verdict: str = "found", *, tok: float | None = None,
          gate: str = "passed", gpus: int = 1, cap: str = "--max 32") -> dict:
    return {"run": f"{variant}-{c}-{good}", "gpus_used": gpus, "campaign": {"variant": variant},
            "gate": {"status": gate}, "points": [],
            "capacity": {"find": "max-concurrency", "slo": "chat", "slo_text": "ttft_p90<=250ms", "capacity": c,
                         "verdict": verdict, "binding": None, "point": 0, "goodput_request_s": good,
                         "output_tok_s": tok if tok is not None else good * 128,
                         "cap": {"load": 32.0, "reason": cap}}}


def _rec(views: list[dict], outputs: dict | None = None) -> dict:
    (rec,) = recommendations(capacity_rows(views, outputs=outputs))
    return rec


def _md(views: list[dict], outputs: dict | None = None) -> list[str]:
    return "\n".join(campaign_section(capacity_rows(views, outputs=outputs))).splitlines()


def _doc(reference: str, checks: dict[str, tuple[str, int, int]], may_differ: tuple[str, ...] = ()) -> dict:
    """campaign.json as the runner writes it: one cell per variant (`VARIANT#1`), the output check's verdict
    per cell against the reference variant's first done cell."""
    variants = {v: {"overrides": {}, "knobs": {}, "replicas": 1, "outputs_may_differ": v in may_differ}
                for v in [reference, *checks]}
    return {"reference": reference, "variants": variants,
            "cells": [{"id": f"{v}#1", "variant": v, "state": "done"} for v in variants],
            "outputs_vs_reference": {"reference": reference, "cells": {
                f"{v}#1": {"verdict": verdict, "identical": same, "prompts": n} for v, (verdict, same, n)
                in checks.items()}}}


# --- goodput, not concurrency ----------------------------------------------------------------------

def test_the_variant_carrying_more_good_requests_wins_though_it_took_fewer_users():
    # many slow users "fit" more of them: c=32 at 30 good req/s loses to c=16 at 52
    rec = _rec([_view("many", 32, 30.0), _view("fast", 16, 52.0)])
    assert (rec["verdict"], rec["best"], rec["next"]) == ("recommended", "fast", "many")
    assert round(rec["by"], 4) == round(52 / 30 - 1, 4)


def test_goodput_is_per_gpu():
    # two GPUs carrying 80 is 40 a GPU: less than one GPU carrying 50
    rec = _rec([_view("tp2", 32, 80.0, gpus=2), _view("tp1", 16, 50.0)])
    assert rec["best"] == "tp1"


def test_the_table_shows_goodput_and_the_load_it_took():
    md = _md([_view("fast", 16, 52.57, tok=6728.8)])
    row = next(r for r in md if r.startswith("| chat") and "| fast |" in r)
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[2:5] == ["52.57", "6,729", "c=16"]


# --- bounds --------------------------------------------------------------------------------------

def test_a_lower_bound_above_an_exact_figure_decides():
    # capped at >= 50 good req/s carries at least 50: more than an exact 40
    rec = _rec([_view("exact", 8, 40.0), _view("capped", 32, 50.0, "capped")])
    assert (rec["verdict"], rec["best"]) == ("recommended", "capped")


def test_a_lower_bound_below_the_leader_could_still_exceed_it_so_it_is_undecided():
    rec = _rec([_view("exact", 16, 50.0), _view("capped", 32, 30.0, "capped")])
    assert (rec["verdict"], rec["best"], rec["leading"]) == ("undecided", None, "exact")
    assert [(u["variant"], u["step"]) for u in rec["undecided"]] == [("capped", "a higher `max`")]


def test_each_bound_names_the_step_that_would_decide_it():
    steps = {}
    for verdict in ("client-bound", "capped", "unstable above", "step budget spent", "searching"):
        (u,) = _rec([_view("exact", 16, 50.0), _view("b", 8, 20.0, verdict)])["undecided"]
        steps[verdict] = u["step"]
    assert steps == {"client-bound": "more client processes (`client_procs`)", "capped": "a higher `max`",
                     "unstable above": "repeats (campaign `repeats`)",
                     "step budget spent": "a search with more steps",
                     "searching": "a search that runs to its end (the campaign resumed)"}


def test_a_search_stopped_below_its_floor_is_a_bound_that_cannot_reach_the_leader():
    # stop_below: the search stopped at its first failing load, whose completed rate (12 a second) is the most
    # any load below it could carry; under the leader's 50 that bound decides nothing against it
    low = _view("low", 8, 10.0, "below floor")
    low["capacity"]["below_floor"] = {"floor": 40.0, "ceiling": 12.0, "at": 16, "from": "…"}
    (row,) = [r for r in capacity_rows([low]) if r["variant"] == "low"]
    assert (row["bound"], row["ceiling_per_gpu"], row["steps"]) == (
        True, 12.0, ["a search without `stop_below` (this one stopped once no load could carry it)"])
    rec = _rec([_view("exact", 16, 50.0), low])
    assert (rec["verdict"], rec["best"], rec["next"]) == ("recommended", "exact", "low")
    assert pair(capacity_rows([_view("exact", 16, 50.0)])[0], row)["verdict"] == "A"
    # a ceiling above the leader's figure could still exceed it: undecided, as any bound
    low["capacity"]["below_floor"]["ceiling"] = 60.0
    assert _rec([_view("exact", 16, 50.0), low])["verdict"] == "undecided"


def test_a_cap_the_engine_set_is_its_limit_not_a_bound():
    # at the engine's slots (or what its KV cache holds at once) more users only queue: the search found
    # the most this launch runs at once, so its capacity is a figure (workloads/capacity.py caps)
    for reason in ("the engine's 4 slots", "the KV cache (8192 tokens: 4 requests of 2048 at once)"):
        rows = capacity_rows([_view("slots", 4, 30.0, "capped", cap=reason), _view("more", 8, 50.0)])
        assert [r["bound"] for r in rows] == [False, False]
        assert _rec([_view("slots", 4, 30.0, "capped", cap=reason), _view("more", 8, 50.0)])["best"] == "more"


def test_a_cap_set_by_max_is_a_bound():
    (row,) = capacity_rows([_view("a", 32, 30.0, "capped", cap="the default --max 256")])
    assert (row["bound"], row["steps"]) == (True, ["a higher `max`"])


def test_a_bound_leader_wins_over_exact_figures_below_it():
    rec = _rec([_view("capped", 32, 60.0, "capped"), _view("exact", 16, 40.0)])
    assert (rec["verdict"], rec["best"]) == ("recommended", "capped")


def test_a_repeat_whose_search_was_cut_short_makes_the_variant_a_bound():
    rows = capacity_rows([_view("a", 16, 50.0), _view("a", 32, 60.0, "capped")])
    assert rows[0]["bound"] is True


def test_bounds_are_written_as_bounds():
    md = "\n".join(_md([_view("exact", 16, 52.57), _view("capped", 32, 30.15, "capped")]))
    assert "≥ 30.15" in md and "≥ c=32" in md
    assert "≥ 52.57" not in md and "≥ c=16" not in md


def test_undecided_is_said_in_the_recommendation_with_its_step():
    md = _md([_view("exact", 16, 50.0), _view("capped", 32, 30.0, "capped")])
    row = next(r for r in md[md.index("### Recommendation"):] if r.startswith("| chat"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[1] == "**undecided**"
    assert "capped (≥ 30.00 req/s per GPU) could still carry more than exact (50.00)" in cells[2]
    assert "a higher `max` for capped would decide" in cells[2]


# --- greedy outputs against the reference --------------------------------------------------------

def test_outputs_of_reads_the_campaigns_check_per_variant():
    doc = _doc("plain", {"ngram": ("differs", 2, 8), "eagle": ("identical", 8, 8)}, may_differ=("eagle",))
    out = outputs_of(doc)
    assert out["plain"]["check"] == "reference"
    assert (out["ngram"]["check"], out["ngram"]["identical"], out["ngram"]["prompts"],
            out["ngram"]["may_differ"]) == ("differs", 2, 8, False)
    assert (out["eagle"]["check"], out["eagle"]["may_differ"]) == ("identical", True)


def test_no_reference_means_no_output_check():
    assert outputs_of({"variants": {"a": {}}, "cells": []}) == {}


def test_a_variant_whose_outputs_differ_is_not_recommended_however_much_it_carries():
    doc = _doc("plain", {"ngram": ("differs", 2, 8)})
    rec = _rec([_view("plain", 16, 40.0), _view("ngram", 32, 90.0)], outputs_of(doc))
    assert rec["best"] == "plain"
    assert [(x["variant"], x["why"]) for x in rec["left_out"]] == [
        ("ngram", "greedy outputs differ from plain's (2/8 prompts identical); "
                  "`outputs_may_differ = true` on its [[variants]] entry allows it")]


def test_outputs_may_differ_lets_it_be_recommended_and_the_table_says_so():
    doc = _doc("plain", {"ngram": ("differs", 2, 8)}, may_differ=("ngram",))
    views = [_view("plain", 16, 40.0), _view("ngram", 32, 90.0)]
    assert _rec(views, outputs_of(doc))["best"] == "ngram"
    md = "\n".join(_md(views, outputs_of(doc)))
    assert "differ from plain (2/8 identical), allowed: outputs_may_differ" in md


def test_the_table_says_the_output_check_of_every_variant():
    doc = _doc("plain", {"ngram": ("differs", 2, 8), "eagle": ("identical", 8, 8)})
    md = _md([_view("plain", 16, 40.0), _view("ngram", 32, 90.0), _view("eagle", 8, 20.0)], outputs_of(doc))
    head = next(r for r in md if r.startswith("| SLO | variant"))
    col = [c.strip() for c in head.strip("|").split(" | ")].index("greedy outputs")
    cell = {r.split(" | ")[1].strip(): [c.strip() for c in r.strip("|").split(" | ")][col]
            for r in md[:md.index("### Recommendation")] if r.startswith("| chat")}
    assert cell == {"plain": "the reference", "ngram": "differ from plain (2/8 identical): not recommended",
                    "eagle": "identical to plain (8/8)"}


def test_without_a_reference_the_table_says_outputs_were_not_checked():
    md = _md([_view("a", 16, 40.0)])
    assert any("not checked (no campaign `reference`)" in r for r in md)


# --- the 2026-12-06 campaign's shape -------------------------------------------------------------

def test_the_first_gpu_campaign_recommends_plain_not_ngram():
    doc = _doc("plain", {"ngram": ("differs", 2, 8)})
    rec = _rec([_view("plain", 16, 52.57, "client-bound", tok=6728.8),
                _view("ngram", 32, 30.15, "capped", tok=3858.6)], outputs_of(doc))
    assert (rec["verdict"], rec["best"]) == ("recommended", "plain")
    assert rec["left_out"][0]["variant"] == "ngram"


def test_the_same_without_the_output_check_is_undecided_on_ngrams_max():
    rec = _rec([_view("plain", 16, 52.57, "client-bound"), _view("ngram", 32, 30.15, "capped")])
    assert (rec["verdict"], rec["leading"]) == ("undecided", "plain")
    assert [(u["variant"], u["step"]) for u in rec["undecided"]] == [("ngram", "a higher `max`")]


# --- the campaign file's key -----------------------------------------------------------------------

CAMPAIGN = """
[campaign]
name = "spec"
model = "smol"
reference = "plain"

[[variants]]
name = "plain"

[[variants]]
name = "ngram"
{line}

[[workloads]]
kind = "chat"
concurrency = [1]
"""


def test_outputs_may_differ_is_a_variant_key_not_an_override():
    camp = parse(CAMPAIGN.format(line="outputs_may_differ = true"), Path("/x/spec.toml"))
    ngram = camp.variant("ngram")
    assert (ngram.outputs_may_differ, ngram.overrides(), camp.knobs["ngram"]) == (True, {}, {})
    assert camp.variant("plain").outputs_may_differ is False


def test_outputs_may_differ_of_the_wrong_type_names_file_key_value_and_the_fix():
    with pytest.raises(ConfigError) as e:
        parse(CAMPAIGN.format(line='outputs_may_differ = "yes"'), Path("/x/spec.toml"))
    assert e.value.message == ("/x/spec.toml: variants.1.outputs_may_differ: expected true or false (a TOML "
                               "boolean, no quotes), got 'yes': write outputs_may_differ = true to let this "
                               "variant be recommended though its greedy outputs differ from the reference "
                               "variant's")


# --- `servedeck compare A B`: the same rules between two sides --------------------------------------

def _pair(a: dict, b: dict) -> dict:
    rows = {r["variant"]: r for r in capacity_rows([a, b])}
    return pair(rows[a["campaign"]["variant"]], rows[b["campaign"]["variant"]])


def test_pair_b_carries_more_good_requests_at_fewer_users():
    got = _pair(_view("A", 32, 30.15, "found"), _view("B", 16, 52.57, "found"))
    assert (got["verdict"], round(got["change"], 3), got["qualifier"]) == ("B", round(52.57 / 30.15 - 1, 3), "")


def test_pair_a_bound_below_the_other_is_undecided_with_its_step():
    got = _pair(_view("A", 16, 52.57, "client-bound"), _view("B", 32, 30.15, "capped"))
    assert (got["verdict"], got["open"], got["step"]) == ("undecided", "B", "a higher `max`")


def test_pair_a_bound_above_an_exact_figure_decides_and_says_at_least():
    got = _pair(_view("A", 8, 40.0), _view("B", 32, 50.0, "capped"))
    assert (got["verdict"], got["qualifier"]) == ("B", "at least ")


def test_pair_an_exact_figure_below_a_bound_says_at_most():
    got = _pair(_view("A", 32, 50.0, "capped"), _view("B", 8, 40.0))
    assert (got["verdict"], got["qualifier"]) == ("A", "at most ")


def test_pair_equal_exact_figures_are_the_same():
    assert _pair(_view("A", 8, 40.0), _view("B", 16, 40.0))["verdict"] == "same"


def _run(path: Path, view: dict, answers: list[str] | None = None) -> SimpleNamespace:
    """A report Run as compare_capacity reads it: its view, its folder (with outputs.jsonl when answered)."""
    path.mkdir(parents=True)
    if answers is not None:
        (path / "outputs.jsonl").write_text("".join(
            json.dumps({"index": i, "prompt_sha": f"p{i}", "token_ids": [ord(ch) for ch in text]}) + "\n"
            for i, text in enumerate(answers)))
    return SimpleNamespace(view=view, path=path, gpus_used=view["gpus_used"])


def test_compare_ranks_by_goodput_and_names_differing_outputs(tmp_path):
    a = _run(tmp_path / "plain", _view("plain", 16, 52.57, "client-bound"), ["ab", "cd", "ef", "gh"])
    b = _run(tmp_path / "ngram", _view("ngram", 32, 30.15, "capped"), ["ab", "cX", "eX", "gX"])
    (row,) = compare_capacity([a], [b])
    assert (row["a"], row["b"], row["verdict"], row["decide"]) == (16, 32, "undecided", "a higher `max`")
    assert row["text"].startswith("A ≥ 52.57 at ≥ c=16, B ≥ 30.15 at ≥ c=32 (good req/s per GPU at the load it "
                                  "took): undecided: B (≥ 30.15) could still carry more than A (≥ 52.57); a higher "
                                  "`max` for B would decide")
    assert ("B's greedy outputs differ from A's (1/4 prompts identical): B is not recommended in A's place unless "
            "its campaign entry says outputs_may_differ = true") in row["text"]


def test_compare_without_the_output_check_says_so(tmp_path):
    a = _run(tmp_path / "a", _view("a", 8, 40.0))
    b = _run(tmp_path / "b", _view("b", 16, 20.0))
    (row,) = compare_capacity([a], [b])
    assert "A 40.00 at c=8, B 20.00 at c=16 (good req/s per GPU at the load it took): B carries -50%" in row["text"]
    assert "greedy outputs not compared" in row["text"]


# --- one run's summary.md and `show` ---------------------------------------------------------------

def test_one_runs_summary_writes_a_bound_as_a_bound_with_its_step():
    view = _view("plain", 16, 52.57, "client-bound", tok=6728.8)
    view["capacity"].update({"slo": "interactive", "cap": {"load": 32.0, "reason": "--max 32"}, "steps": 7,
                             "requests": 1109, "boundary": {"max_passing": 16.0, "min_failing": None}})
    text = "\n".join(run_section(view))
    assert "**Capacity ≥ c=16** (a lower bound on the max concurrency within `ttft_p90<=250ms`: the search " \
           "ended client-bound; more client processes (`client_procs`) would pin it down)" in text
    assert "Goodput there ≥ 52.57 requests/s, ≥ 6,729 output tok/s." in text


def test_one_runs_summary_writes_a_found_capacity_as_a_figure():
    view = _view("plain", 16, 52.57, "found", tok=6728.8)
    view["capacity"].update({"slo": "interactive", "cap": {"load": 32.0, "reason": "--max 32"}, "steps": 7,
                             "requests": 1109, "boundary": {"max_passing": 16.0, "min_failing": 20.0}})
    text = "\n".join(run_section(view))
    assert "**Capacity c=16** (max concurrency within `ttft_p90<=250ms`; found)" in text
    assert "Goodput there 52.57 requests/s, 6,729 output tok/s." in text
