"""The model page's tunes, without processes: which searched trials of a finished tune lost and why, in the tune's
own words (page/tuned.py), and the "Tried and refuted" section showing them for a tune folder in the results dir.
The tune.json documents are written by hand after docs/tune-runs/2026-12-06-llamacpp/gemma8b and smol8c."""

from __future__ import annotations

import json
from pathlib import Path

from servedeck.modelsfile import parse
from servedeck.page.tuned import lost_trials, tune_entry, tunes_of

VALUES = {"args.parallel": 8, "args.threads": 2}
SPREAD_WHY = ("median 0.93 against the starter's 0.882: +0.0475, spread 0.147; ahead in 2 of 3 rounds, paired lead "
              "-0.0878..+0.183 (95 %): it did not lead in every round")
BELOW_WHY = "median 0.841 against the starter's 0.882: -0.0414, spread 0.153"


def trial(name, verdict, value=None, why=None, values=None, state="done", bound=False):
    return {"trial": name, "values": VALUES if values is None else values, "state": state, "verdict": verdict,
            "value": value, "bound": bound, "why": why, "campaign": f"gemma8b.{name}__1206-222858", "outputs": None}


def gemma(**over):
    """gemma8b's shape: two broke a rule or gave other answers, two verified and did not hold, one measured below."""
    doc = {
        "schema": 2, "name": "gemma8b", "file": "/tmp/tuneg/search.toml", "model": "gemma", "slo": "chat",
        "started": "2026-12-06T22:28:23+00:00", "finished": True,
        "trials": [
            trial("starter", "measured", 1.0105195080791034, values={}),
            trial("t1", "broke-rule", why="breaks args.ubatch-size <= args.batch-size",
                  values={"args.parallel": 4, "args.ubatch-size": 177, "args.batch-size": 129}),
            trial("t2", "measured", 0.957552801456374),
            trial("t3", "measured", 1.0380999552708683),
            trial("t4", "measured", 0.8618708342909677, values={"args.parallel": 8, "args.threads": 2}),
            trial("t5", "outputs-differ", why="greedy outputs differ from the starter's (1/2 prompts identical); "
                                              "search.outputs_may_differ = true allows it",
                  values={"args.parallel": 1, "args.cache-type-k": "q8_0"}),
        ],
        "best": {"slo": "chat", "verdict": "recommended", "leading": "t3"},
        "verification": {"state": "done", "top": 2, "repeats": 3, "candidates": ["t3", "t2"], "verdict": "not held",
                         "winner": None, "why": "no candidate's margin over the starter held: ...",
                         "trials": {"starter": {"median": 0.882, "outcome": "baseline"},
                                    "t3": {"median": 0.841, "spread": 0.153, "margin": -0.0414, "outcome": "below the starter",
                                           "why": BELOW_WHY, "rounds": {"won": 1, "pairs": 3}},
                                    "t2": {"median": 0.93, "spread": 0.147, "margin": 0.0475,
                                           "outcome": "within the spread", "why": SPREAD_WHY,
                                           "rounds": {"won": 2, "pairs": 3}}}},
    }
    return {**doc, **over}


def test_each_losing_trial_says_why_in_the_tunes_own_words():
    assert lost_trials(gemma()) == [
        {"trial": "t1", "values": "parallel=4, ubatch-size=177, batch-size=129", "verdict": "broke-rule",
         "why": "breaks args.ubatch-size <= args.batch-size", "campaign": "gemma8b.t1__1206-222858"},
        {"trial": "t2", "values": "parallel=8, threads=2", "verdict": "verification: within the spread",
         "why": SPREAD_WHY, "campaign": "gemma8b.t2__1206-222858"},
        {"trial": "t3", "values": "parallel=8, threads=2", "verdict": "verification: below the starter",
         "why": BELOW_WHY, "campaign": "gemma8b.t3__1206-222858"},
        {"trial": "t4", "values": "parallel=8, threads=2", "verdict": "measured",
         "why": "0.86 good req/s per GPU within SLO chat against the starter's 1.01",
         "campaign": "gemma8b.t4__1206-222858"},
        {"trial": "t5", "values": "parallel=1, cache-type-k=q8_0", "verdict": "outputs-differ",
         "why": "greedy outputs differ from the starter's (1/2 prompts identical); search.outputs_may_differ = true "
                "allows it", "campaign": "gemma8b.t5__1206-222858"},
    ]


def test_the_verified_winner_and_the_starter_are_not_refuted_and_a_second_that_held_lost_to_the_winner():
    doc = gemma()
    ver = doc["verification"]
    ver.update(verdict="verified", winner="t3")
    ver["trials"]["t3"] = {"median": 1.2, "outcome": "holds", "why": "median 1.2 ...: the margin holds"}
    ver["trials"]["t2"] = {"median": 1.1, "outcome": "holds", "why": "median 1.1 ...: the margin holds"}
    rows = {r["trial"]: r for r in lost_trials(doc)}
    assert set(rows) == {"t1", "t2", "t4", "t5"}
    assert rows["t2"]["verdict"] == "verification: holds"
    assert rows["t2"]["why"] == "median 1.1 ...: the margin holds; t3 held with a higher median"


def test_a_measured_trial_above_the_starter_that_was_not_launched_again_and_the_other_verdicts():
    doc = gemma(trials=[
        trial("starter", "measured", 1.0, values={}, bound=True),
        trial("t6", "measured", 1.05, values={"env.X": "1"}),
        trial("t7", "no-capacity", 0.0, why="no load searched met the SLO", values={}),
        trial("t8", "failed", why="no-such-flag: exit 1"),
        trial("t9", "gate-failed", why="gate failed: its figures are not a result"),
        trial("t10", "no-fit", why=None),
        trial("t11", None, state="running"),
        trial("t12", "interrupted", state="interrupted"),
        trial("t13", "repeated", 1.0, why="the values of starter (measured, 1): not launched again"),
    ])
    rows = {r["trial"]: (r["values"], r["verdict"], r["why"]) for r in lost_trials(doc)}
    assert rows == {
        "t6": ("env.X=1", "measured", "1.05 good req/s per GPU within SLO chat against the starter's ≥ 1.00; not among "
                                      "the best 2 the verification launched again"),
        "t7": ("(the model's entry)", "no-capacity", "no load searched met the SLO"),
        "t8": ("parallel=8, threads=2", "failed", "no-such-flag: exit 1"),
        "t9": ("parallel=8, threads=2", "gate-failed", "gate failed: its figures are not a result"),
        "t10": ("parallel=8, threads=2", "no-fit", "no reason recorded"),
    }


def test_a_tune_without_verification_and_an_older_tune_json_missing_keys():
    """verify = false: the search's recommended trial is the winner; an older document lacks most keys."""
    doc = gemma(verification=None, verify={"top": 0})
    rows = {r["trial"] for r in lost_trials(doc)}
    assert rows == {"t1", "t2", "t4", "t5"}  # t3 is the search's recommendation
    e = tune_entry(Path("/r/tunes/gemma8b__1206-222823"), doc)
    assert (e["verdict"], e["winner"], e["searched"]) == ("not verified (the search's best: recommended)", "t3", 5)
    assert lost_trials({"trials": [{"trial": "t1"}, {"trial": "t2", "state": "done", "verdict": "failed"}]}) == [
        {"trial": "t2", "values": "(the model's entry)", "verdict": "failed", "why": "no reason recorded",
         "campaign": None}]
    assert lost_trials({}) == []


def write(root: Path, folder: str, doc: dict) -> Path:
    p = root / "tunes" / folder
    p.mkdir(parents=True)
    (p / "tune.json").write_text(json.dumps(doc))
    return p


def test_tunes_of_the_model_newest_first_finished_only(tmp_path):
    older = write(tmp_path, "gemma8__1206-200000", gemma(name="gemma8"))
    newer = write(tmp_path, "gemma8b__1206-222823", gemma())
    write(tmp_path, "smol8c__1206-193526", gemma(name="smol8c", model="smollm2"))
    write(tmp_path, "gemma9__1206-230000", gemma(name="gemma9", finished=False))
    (tmp_path / "tunes" / "broken__1206-230500").mkdir()
    (tmp_path / "tunes" / "broken__1206-230500" / "tune.json").write_text("{not json")
    tunes, unreadable = tunes_of("gemma", tmp_path / "tunes")
    assert [(t["name"], t["folder"]) for t in tunes] == [("gemma8b", str(newer)), ("gemma8", str(older))]
    assert tunes[0]["verdict"] == "not held" and tunes[0]["winner"] is None and len(tunes[0]["lost"]) == 5
    assert len(unreadable) == 1 and "broken__1206-230500" in unreadable[0]


TOML = """
[builds.b]
engine = "vllm"
python = "/nonexistent/bin/python"

[models.gemma]
source = "org/model"
build = "b"
port = 8000
"""


def test_the_page_shows_a_tunes_losing_trials_under_tried_and_refuted(tmp_path, monkeypatch):
    from servedeck.page import build_page, to_markdown

    results = tmp_path / "results"
    folder = write(results, "gemma8b__1206-222823", gemma())
    monkeypatch.setenv("SERVEDECK_RESULTS", str(results))
    doc = build_page(parse(TOML, tmp_path / "models.toml"), "gemma")
    [t] = doc["sections"]["tried"]["tunes"]
    assert t["folder"] == str(folder) and doc["history"] is True
    md = to_markdown(doc)
    section = md.split("## Tried and refuted")[1].split("\n## ")[0]
    assert "Tune gemma8b (2026-12-06 22:28:23): verification not held; 5 of 5 searched trials lost" in section
    assert str(folder) in section
    assert "0.86 good req/s per GPU within SLO chat against the starter's 1.01" in section
    assert "breaks args.ubatch-size <= args.batch-size" in section
    assert "No campaign has varied this model yet" in section  # campaigns none; the tune is shown all the same


def test_the_section_names_the_winner_kept_and_a_search_only_tune_is_not_called_verified():
    from servedeck.page.blocks import Link, Para, Table
    from servedeck.page.sections import tried

    won = gemma()
    won["verification"].update(verdict="verified", winner="t3")
    won["verification"]["trials"]["t3"] = {"median": 1.2, "outcome": "holds", "why": "the margin holds"}
    entries = [tune_entry(Path("/r/tunes/a__1206-230000"), won),
               tune_entry(Path("/r/tunes/b__1206-220000"), gemma(verification=None))]
    doc = {"sections": {"tried": {"campaigns": [], "refuted": [], "unreadable": [], "tunes": entries}}}
    blocks = tried(doc, lambda text, target: Link(text, target))
    heads = [b.parts for b in blocks if isinstance(b, Para)][1:]  # after the no-campaign sentence
    assert heads == [
        ["Tune gemma8b (2026-12-06 22:28:23): verification verified: t3 kept; 4 of 5 searched trials lost (",
         Link("folder", "/r/tunes/a__1206-230000"), "):"],
        ["Tune gemma8b (2026-12-06 22:28:23): not verified (the search's best: recommended): t3 kept; 4 of 5 searched "
         "trials lost (", Link("folder", "/r/tunes/b__1206-220000"), "):"]]
    assert [[r[0] for r in b.rows] for b in blocks if isinstance(b, Table)] == [["t1", "t2", "t4", "t5"]] * 2


def test_the_section_says_what_moved_the_objective_where_the_tune_recorded_it():
    from servedeck.page.blocks import Link, Para
    from servedeck.page.sections import tried

    imp = {"evaluator": "fANOVA", "trials": 4, "note": None,
           "importance": {"args.parallel": 0.812, "args.threads": 0.188}}
    entries = [tune_entry(Path("/r/tunes/a__1206-230000"), gemma(importance=imp)),
               tune_entry(Path("/r/tunes/b__1206-220000"), gemma(importance={"importance": {}, "note": "2 trials"}))]
    assert [e["importance"] for e in entries] == ["parallel 0.81, threads 0.19", None]
    doc = {"sections": {"tried": {"campaigns": [], "refuted": [], "unreadable": [], "tunes": entries}}}
    heads = [b.parts for b in tried(doc, lambda text, target: Link(text, target)) if isinstance(b, Para)][1:]
    assert heads[0][-1] == "); what moved its objective (fANOVA shares): parallel 0.81, threads 0.19:"
    assert heads[1][-1] == "):"
