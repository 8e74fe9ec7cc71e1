"""The tune file, pure: a campaign file whose variants the search chooses; each trial a one-variant campaign."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.errors import ConfigError
from servedeck.tune.file import STARTER, parse

HEAD = """
[campaign]
name = "smol-tune"
model = "smollm2"
cell_timeout = "5m"
gate = { context = 256, depths = [0.5], repeats = 1 }

[slo.chat]
ttft_p90 = "2s"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["chat"]
input_tokens = 32
output_tokens = 8
requests = 4
max = 4
"""
SEARCH = """
[search]
trials = 3
[search.space]
"args.parallel" = [1, 2]
"args.batch-size" = { low = 32, high = 256, log = true }
"""
PATH = Path("/tmp/t.toml")


def test_a_tune_file_is_a_campaign_with_the_starter_as_its_reference():
    t = parse(HEAD + SEARCH, PATH)
    assert t.name == "smol-tune" and t.slo == "chat" and t.space.trials == 3
    assert [v.name for v in t.camp.variants] == [STARTER] and t.camp.head.reference == STARTER


def test_a_trial_is_a_one_variant_campaign_with_the_output_check_first():
    t = parse(HEAD + SEARCH, PATH)
    c = t.trial_campaign("t2", {"args.parallel": 2, "args.batch-size": 64})
    assert c.name == "smol-tune.t2" and c.head.reference == "t2"
    assert [(v.name, v.args) for v in c.variants] == [("t2", {"parallel": 2, "batch-size": 64})]
    assert [w.title for w in c.file.workloads] == ["output check", "capacity"]
    assert c.file.workloads[0].requests == 1  # the check's prompts are the point; its load is one request


def test_without_the_output_check_a_trial_runs_the_files_workloads_only():
    t = parse(HEAD + SEARCH.replace("trials = 3", "trials = 3\ncheck_outputs = false"), PATH)
    c = t.trial_campaign("t1", {"args.parallel": 1})
    assert [w.title for w in c.file.workloads] == ["capacity"] and c.head.reference is None


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as e:
        parse(text, PATH)
    return e.value.message


def test_listed_variants_and_a_matrix_are_refused():
    msg = _error(HEAD + '[[variants]]\nname = "a"\n[matrix]\n"args.parallel" = [1]\n' + SEARCH)
    assert "/tmp/t.toml: variants: a tune's variants are chosen by its [search] table" in msg
    assert "/tmp/t.toml: matrix:" in msg


def test_keys_the_tune_sets_itself_are_refused():
    msg = _error(HEAD.replace('cell_timeout = "5m"', 'cell_timeout = "5m"\nrepeats = 2\nreference = "x"') + SEARCH)
    assert "campaign.repeats: a tune sets it itself" in msg and "campaign.reference:" in msg
    assert "campaign.reference_run: a tune sets it itself" in _error(
        HEAD.replace('cell_timeout = "5m"', 'cell_timeout = "5m"\nreference_run = "r"') + SEARCH)


def test_a_searched_trial_is_held_against_the_starters_run_as_soon_as_it_answers():
    t = parse(HEAD + SEARCH, PATH)
    c = t.trial_campaign("t2", {"args.parallel": 2}, reference_run="/r/runs/starter-run")
    assert c.head.reference == "t2" and c.head.reference_run == "/r/runs/starter-run"
    off = parse(HEAD + SEARCH.replace("trials = 3", "trials = 3\ncheck_outputs = false"), PATH)
    assert off.trial_campaign("t2", {"args.parallel": 2}, reference_run="/r").head.reference_run is None


def test_a_searched_trials_capacity_search_is_held_to_the_best_so_far():
    t = parse(HEAD + SEARCH, PATH)
    c = t.trial_campaign("t2", {"args.parallel": 2}, stop_below=1.25)
    (cap,) = [w for w in c.file.workloads if w.kind == "capacity"]
    assert cap.stop_below == {"chat": 1.25}
    assert t.trial_campaign("t2", {"args.parallel": 2}).file.workloads[-1].stop_below is None
    assert t.space.prune is True
    assert parse(HEAD + SEARCH.replace("trials = 3", "trials = 3\nprune = false"), PATH).space.prune is False
    assert "search.prune: expected true or false" in _error(HEAD + SEARCH.replace("trials = 3", 'trials = 3\nprune = "no"'))
    assert "workloads[0].stop_below: a tune sets it itself" in _error(
        HEAD.replace("max = 4", "max = 4\nstop_below = { chat = 2.0 }") + SEARCH)


def test_a_tune_needs_a_capacity_workload():
    text = HEAD.split("[[workloads]]")[0] + '[[workloads]]\nkind = "chat"\nconcurrency = [1]\n' + SEARCH
    assert 'workloads: a tune needs a capacity workload (kind = "capacity"' in _error(text)


def test_two_searched_slos_need_search_slo():
    text = HEAD.replace('slo = ["chat"]', 'slo = ["chat", "fast"]') + '[slo.fast]\nttft_p90 = "1s"\n' + SEARCH
    assert "search.slo: the capacity workloads name chat, fast" in _error(text)
    assert parse(text.replace("trials = 3", 'trials = 3\nslo = "fast"'), PATH).slo == "fast"
    assert "search.slo: 'slow' is not an SLO" in _error(text.replace("trials = 3", 'trials = 3\nslo = "slow"'))


def test_a_search_problem_names_the_file_and_key():
    assert _error(HEAD + SEARCH.replace("high = 256", "high = 16")) == (
        '/tmp/t.toml: search.space."args.batch-size": low = 32 is above high = 16: expected low <= high; swap them')


def test_the_campaign_parts_are_checked_as_a_campaigns():
    assert "campaign.cell_timeout" in _error(HEAD.replace('"5m"', '"soon"') + SEARCH)


def test_a_sampled_value_wrong_for_a_variant_is_a_config_error():
    t = parse(HEAD + SEARCH.replace('"args.parallel" = [1, 2]', '"tp" = [0, 1]'), PATH)
    with pytest.raises(ConfigError) as e:
        t.trial_campaign("t1", {"tp": 0})
    assert "tp" in e.value.message


def test_an_ungated_tune_is_refused():
    text = HEAD.replace("gate = { context = 256, depths = [0.5], repeats = 1 }", "gate = false") + SEARCH
    assert "campaign.gate: a tune gates every trial" in _error(text)
