"""The [search] table, pure: what each kind of entry samples, `when` and `together`, `require`, the budget, and
the errors a user reads (the key path, what is wrong, what to write)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from servedeck.engines import get_engine
from servedeck.tune.space import (Categorical, IntRange, SpaceError, Together, known_values, overrides,
                                     parse_search)

optuna.logging.set_verbosity(optuna.logging.WARNING)


class FixedTrial:
    """A trial answering each suggestion from a table (the first choice / the low end where none is given)."""

    def __init__(self, picks=None):
        self.picks, self.asked = picks or {}, []

    def suggest_categorical(self, name, choices):
        self.asked.append(name)
        return self.picks.get(name, choices[0])

    def suggest_int(self, name, low, high, *, step=1, log=False):
        self.asked.append(name)
        return self.picks.get(name, low)


SPACE = {
    "trials": 6,
    "space": {
        "args.parallel": [1, 2, 4],
        "args.batch-size": {"low": 64, "high": 1024, "log": True},
        "args.ubatch-size": {"low": 32, "high": 512, "log": True},
        "args.spec": {"values": ["none", "ngram"]},
        "args.draft-max": {"values": [4, 8], "when": {"args.spec": ["ngram"]}},
        "kv": {"together": [{"args.cache-type-k": "f16", "args.cache-type-v": "f16"},
                            {"args.cache-type-k": "q8_0", "args.cache-type-v": "q8_0"}]},
    },
    "require": ["args.ubatch-size <= args.batch-size"],
}


def test_each_kind_of_entry_becomes_its_knob():
    sp = parse_search(SPACE)
    kinds = {k.name: type(k) for k in sp.knobs}
    assert kinds == {"args.parallel": Categorical, "args.batch-size": IntRange, "args.ubatch-size": IntRange,
                     "args.spec": Categorical, "args.draft-max": Categorical, "kv": Together}
    assert sp.trials == 6 and sp.wall_s is None and sp.check_outputs and not sp.outputs_may_differ
    assert set(sp.keys) >= {"args.cache-type-k", "args.cache-type-v", "args.parallel"}


def test_a_conditional_knob_is_sampled_only_when_its_condition_holds():
    sp = parse_search(SPACE)
    off = FixedTrial({"args.spec": "none"})
    assert "args.draft-max" not in sp.sample(off) and "args.draft-max" not in off.asked
    on = FixedTrial({"args.spec": "ngram", "args.draft-max": 8})
    assert sp.sample(on)["args.draft-max"] == 8


def test_keys_taken_together_are_set_as_one():
    sp = parse_search(SPACE)
    got = sp.sample(FixedTrial({"kv": "cache-type-k=q8_0,cache-type-v=q8_0"}))
    assert (got["args.cache-type-k"], got["args.cache-type-v"]) == ("q8_0", "q8_0")
    assert overrides(got)["args"]["cache-type-v"] == "q8_0"


def test_the_starters_point_is_where_its_values_lie_in_the_space():
    sp = parse_search(SPACE)
    known = {"args.parallel": 2, "args.batch-size": 1024, "args.ubatch-size": 512, "args.spec": "none",
             "args.cache-type-k": "f16", "args.cache-type-v": "f16"}
    assert sp.point(known) == {"args.parallel": 2, "args.batch-size": 1024, "args.ubatch-size": 512,
                               "args.spec": "none", "kv": "cache-type-k=f16,cache-type-v=f16"}


def test_a_value_outside_a_knob_or_unknown_is_left_out_of_the_point():
    sp = parse_search(SPACE)
    # parallel 3 is not a value; batch 2048 is above 1024; ubatch unknown; kv q8_0 for K only matches no set;
    # draft-max is searched only when spec is ngram: the point follows the same `when`
    got = sp.point({"args.parallel": 3, "args.batch-size": 2048, "args.spec": "ngram", "args.draft-max": 8,
                    "args.cache-type-k": "q8_0", "args.cache-type-v": "f16"})
    assert got == {"args.spec": "ngram", "args.draft-max": 8}
    assert "args.draft-max" not in sp.point({"args.spec": "none", "args.draft-max": 8})
    assert sp.point({"args.parallel": True}) == {}  # a bool is not the 1 of [1, 2, 4]


def test_an_entrys_known_values_are_its_own_else_the_engines_fixed_defaults():
    class Entry:  # a models.toml entry's fields as the function reads them
        args = {"-np": 4, "ctk": "q8_0"}
        env = {"OMP_NUM_THREADS": "2"}
        context = 8192

    keys = ("args.parallel", "args.batch-size", "args.ubatch-size", "args.threads", "env.OMP_NUM_THREADS",
            "context", "gpu_memory_utilization")
    got = known_values(keys, Entry(), get_engine("llamacpp"))
    # -np is --parallel; batch and ubatch from llama-server's --help defaults; threads has no fixed default;
    # gpu_memory_utilization is not on the entry
    assert got == {"args.parallel": 4, "args.batch-size": 2048, "args.ubatch-size": 512,
                   "env.OMP_NUM_THREADS": "2", "context": 8192}
    # what a launch of it took at boot fills in threads; the entry and the fixed defaults still come first
    booted = known_values(keys, Entry(), get_engine("llamacpp"), {"--threads": 2, "--batch-size": 99, "--parallel": 9})
    assert booted == {**got, "args.threads": 2}


def test_llamacpp_says_the_threads_it_took_at_boot_only_where_its_log_does():
    line = ("0.00.031.369 I cmn  common_param: system_info: n_threads = 6 (n_threads_batch = 8) / 16 | CPU : SSE3 = 1 "
            "| AVX2 = 1 |")
    assert get_engine("llamacpp").booted_flags(line) == {"--threads": 6, "--threads-batch": 8}
    # at --log-verbosity 3 (the recorded 11434 boot) there is no system_info line: unknown, not guessed
    log = (Path(__file__).parent.parent / "data" / "logs" / "llama-server-11434-boot.log").read_text()
    assert get_engine("llamacpp").booted_flags(log) == {}
    assert get_engine("vllm").booted_flags(line) == {}


def test_a_rule_names_what_it_breaks_and_leaves_unset_keys_alone():
    sp = parse_search(SPACE)
    assert sp.broken_rules({"args.batch-size": 64, "args.ubatch-size": 128}) == ["args.ubatch-size <= args.batch-size"]
    assert sp.broken_rules({"args.batch-size": 128, "args.ubatch-size": 128}) == []
    assert sp.broken_rules({"args.ubatch-size": 128}) == []  # the engine's default batch decides


def test_optuna_samples_within_the_ranges_and_on_log_scale():
    sp = parse_search(SPACE)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=1, n_startup_trials=3))
    for _ in range(12):
        t = study.ask()
        v = sp.sample(t)
        assert v["args.parallel"] in (1, 2, 4) and 64 <= v["args.batch-size"] <= 1024
        assert ("args.draft-max" in v) == (v["args.spec"] == "ngram")
        study.tell(t, float(v["args.parallel"]))
    assert study.trials[0].distributions["args.batch-size"].log


def test_overrides_nest_by_key():
    assert overrides({"args.parallel": 4, "env.X": "1", "context": 4096}) == {
        "args": {"parallel": 4}, "env": {"X": "1"}, "context": 4096}


def test_startup_trials_default_to_a_third_of_the_budget():
    assert parse_search({**SPACE, "trials": 3}).startup_trials == 2
    assert parse_search({**SPACE, "trials": 60}).startup_trials == 10
    assert parse_search({**SPACE, "startup": 1}).startup_trials == 1


@pytest.mark.parametrize("raw, where, says", [
    ({"space": {"args.parallel": [1, 2]}}, "search", "no budget"),
    ({"trials": 0, "space": {"args.parallel": [1]}}, "search.trials", "1 or more"),
    ({"wall": "soon", "space": {"args.parallel": [1]}}, "search.wall", "not a duration"),
    ({"trials": 2}, "search.space", "nothing to search"),
    ({"trials": 2, "space": {"parallel": [1, 2]}}, 'search.space."parallel"', "args.NAME"),
    ({"trials": 2, "space": {"gpus": [[0], [1]]}}, 'search.space."gpus"', "where a trial runs"),
    ({"trials": 2, "space": {"args": [1, 2]}}, 'search.space."args"', "name the flag"),
    ({"trials": 2, "space": {"args.b": {"low": 512, "high": 64}}}, 'search.space."args.b"', "swap them"),
    ({"trials": 2, "space": {"args.b": {"low": 0, "high": 64, "log": True}}}, 'search.space."args.b".low', "drop log"),
    ({"trials": 2, "space": {"args.b": {"low": 1, "high": 64, "log": True, "step": 2}}}, 'search.space."args.b"',
     "step and log"),
    ({"trials": 2, "space": {"args.b": {"low": 1.5, "high": 64}}}, 'search.space."args.b".low', "integer"),
    ({"trials": 2, "space": {"args.b": {"low": 1, "high": 64, "sted": 2}}}, 'search.space."args.b"', "'sted'"),
    ({"trials": 2, "space": {"args.b": []}}, 'search.space."args.b"', "non-empty list"),
    ({"trials": 2, "space": {"args.b": [1, 1]}}, 'search.space."args.b"', "listed twice"),
    ({"trials": 2, "space": {"args.d": {"values": [1], "when": {"args.s": ["x"]}}, "args.s": ["x"]}},
     'search.space."args.d".when', "list it before"),
    ({"trials": 2, "space": {"args.d": {"values": [1], "when": {"args.z": ["x"]}}}},
     'search.space."args.d".when', "not searched"),
    ({"trials": 2, "space": {"kv": {"together": [{"args.k": "a"}]}}}, 'search.space."kv".together', "two or more"),
    ({"trials": 2, "space": {"kv": {"together": [{"args.k": "a"}, {"args.v": "b"}]}}}, 'search.space."kv".together',
     "same keys"),
    ({"trials": 2, "space": {"args.k": [1], "kv": {"together": [{"args.k": 1}, {"args.k": 2}]}}}, "search.space",
     "set by two entries"),
    ({"trials": 2, "space": {"args.b": [1]}, "require": ["args.b << 3"]}, "search.require[0]", "a relation"),
    ({"trials": 2, "space": {"args.b": [1]}, "require": ["args.c <= 3"]}, "search.require[0]", "not a key"),
    ({"trials": 2, "space": {"args.b": [1]}, "tirals": 3}, "search.tirals", "unknown key"),
    ({"trials": 2, "space": {"args.b": [1]}, "outputs_may_differ": "yes"}, "search.outputs_may_differ", "no quotes"),
])
def test_a_wrong_search_table_names_the_key_and_what_to_write(raw, where, says):
    with pytest.raises(SpaceError) as e:
        parse_search(raw)
    assert e.value.where == where
    assert says in e.value.what
