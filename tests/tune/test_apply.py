"""`tune apply`, pure: which trial wins (the verdict rules', undecided only on request) and the models.toml text it
writes (the user's comments and layout kept; each applied key with its `why`)."""

from __future__ import annotations

import pytest

from servedeck.config.tomlfile import read_toml
from servedeck.errors import ConfigError, UsageError
from servedeck.tune.apply import applied, changes, reason, winner

MODELS = """# my models
[models.smollm2]
source = "x.gguf"   # the small one
build = "llamacpp"
args = { parallel = 4 }
context = 8192

[models.other]
source = "y.gguf"
build = "llamacpp"
"""

DOC = {"name": "smoltune", "slo": "chat",
       "trials": [{"trial": "starter", "values": {}, "value": 1.0, "bound": False},
                  {"trial": "t2", "values": {"args.parallel": 2, "args.batch-size": 128}, "value": 1.5, "bound": True}],
       "best": {"verdict": "recommended", "best": "t2", "leading": "t2"}}


def test_the_recommended_trial_wins():
    assert winner(DOC, leading=False)["trial"] == "t2"


def test_an_undecided_tune_is_applied_only_when_asked():
    doc = {**DOC, "best": {"verdict": "undecided", "leading": "t2",
                           "undecided": [{"variant": "t1", "step": "a higher `max`"}]}}
    with pytest.raises(UsageError) as e:
        winner(doc, leading=False)
    assert "t1: a higher `max`" in e.value.message and "--leading" in e.value.hint
    assert winner(doc, leading=True)["trial"] == "t2"


def test_no_figure_no_winner():
    with pytest.raises(UsageError):
        winner({**DOC, "best": {"verdict": "none"}}, leading=True)


def test_applied_values_and_their_why_keep_the_users_file():
    why = reason(DOC, DOC["trials"][1], "smoltune__1206-1200")
    assert "trial t2: ≥ 1.5 good req/s per GPU within SLO chat against the starter's 1" in why
    text = applied(MODELS, "smollm2", DOC["trials"][1]["values"], why)
    assert text.startswith("# my models") and 'source = "x.gguf"   # the small one' in text
    entry = read_toml(text, None)["models"]["smollm2"]
    assert entry["args"] == {"parallel": 2, "batch-size": 128} and entry["context"] == 8192
    assert entry["why"] == {"parallel": why, "batch-size": why}
    assert "why" not in read_toml(text, None)["models"]["other"]


def test_a_top_level_key_is_set_on_the_entry():
    entry = read_toml(applied(MODELS, "smollm2", {"context": 4096}, "r"), None)["models"]["smollm2"]
    assert entry["context"] == 4096 and entry["why"] == {"context": "r"}


def test_what_changes_is_said_before():
    assert changes(MODELS, "smollm2", {"args.parallel": 2, "args.batch-size": 128}) == [
        ("args.parallel", 4, 2), ("args.batch-size", None, 128)]


def test_a_missing_entry_is_named():
    with pytest.raises(ConfigError) as e:
        applied(MODELS, "gone", {"context": 1}, "r")
    assert "[models.gone]" in e.value.message


def test_an_args_table_of_its_own_keeps_its_layout_and_comments():
    text = '[models.t]\nsource = "y"\n\n[models.t.args]\nparallel = 1  # mine\n'
    out = applied(text, "t", {"args.parallel": 2}, "r")
    assert "parallel = 2  # mine" in out
    assert read_toml(out, None)["models"]["t"]["why"] == {"parallel": "r"}


def test_an_inline_args_table_is_rewritten_evenly_spaced():
    out = applied(MODELS, "smollm2", {"args.parallel": 2, "args.batch-size": 128}, "r")
    assert "args = {parallel = 2, batch-size = 128}" in out
