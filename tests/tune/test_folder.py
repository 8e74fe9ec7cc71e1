"""tune.md, rebuilt from tune.json alone, pure: each trial's values, verdict, figure (a bound marked ≥) or why none,
and the best so far in the verdict rules' words."""

from __future__ import annotations

from servedeck.tune.folder import best_sentence, render_markdown


def _row(good, cap, bound):
    return {"slo": "chat", "find": "max-concurrency", "capacity": cap, "output_tok_s_per_gpu": good * 10,
            "bound": bound}


DOC = {"name": "smoltune", "file": "/x/search.toml", "model": "smollm2", "host": "h", "slo": "chat",
       "budget": {"trials": 3, "wall": None}, "sampler": "optuna TPESampler", "seed": 0, "startup_trials": 2,
       "space": [{"name": "args.parallel", "kind": "categorical", "range": "1 | 2", "when": None},
                 {"name": "args.draft-max", "kind": "categorical", "range": "4 | 8", "when": {"args.spec": ["ngram"]}}],
       "require": ["args.ubatch-size <= args.batch-size"],
       "trials": [
           {"trial": "starter", "values": {}, "state": "done", "verdict": "measured", "value": 1.25, "bound": False,
            "row": _row(1.25, 4, False), "outputs": {"check": "reference"}, "why": None, "campaign": "smoltune.starter__1"},
           {"trial": "t1", "values": {"args.parallel": 2}, "state": "done", "verdict": "measured", "value": 2.5,
            "bound": True, "row": _row(2.5, 2, True), "outputs": {"check": "identical"},
            "why": "a lower bound: a higher `max` would pin it down", "campaign": "smoltune.t1__1"},
           {"trial": "t2", "values": {"args.parallel": 1}, "state": "done", "verdict": "outputs-differ", "value": None,
            "bound": False, "row": None, "outputs": {"check": "differs"}, "why": "greedy outputs differ", "campaign": "c"},
           {"trial": "t3", "values": {"args.parallel": 2}, "state": "interrupted", "verdict": None, "why": "Ctrl-C"}],
       "best": {"verdict": "recommended", "leading": "t1", "best": "t1", "goodput_per_gpu": 2.5, "bound": True,
                "next": "starter", "by": 1.0}}


def test_each_trial_is_a_row_with_its_figure_or_why():
    md = render_markdown(DOC)
    assert "| t1 | args.parallel=2 | done | measured | ≥ 2.50 good req/s (≥ 25.0 tok/s) at c=2 | identical |" in md
    assert "| starter | (the model's entry) | done | measured | 1.25 good req/s (12.5 tok/s) at c=4 | reference |" in md
    assert "| t2 | args.parallel=1 | done | outputs-differ | — | differs | greedy outputs differ |" in md
    assert "| t3 | args.parallel=2 | interrupted |  | — |  | Ctrl-C |" in md
    assert "| args.draft-max | categorical | 4 \\| 8 | args.spec in ['ngram'] |" in md
    assert "`args.ubatch-size <= args.batch-size`" in md


def test_the_best_is_said_with_its_bound_and_margin():
    assert best_sentence(DOC["best"]) == "Best so far: **t1 (≥ 2.50 good req/s per GPU)**, +100 % over starter."
    undecided = {"verdict": "undecided", "leading": "t1", "goodput_per_gpu": 2.5, "bound": False,
                 "undecided": [{"variant": "t2", "goodput_per_gpu": 1.0, "step": "a higher `max`"}]}
    assert best_sentence(undecided) == ("Undecided: t1 (2.50 good req/s per GPU) leads, but lower bounds below it "
                                        "could still exceed it: t2 (≥ 1.00: a higher `max`).")
    assert best_sentence(None).startswith("No trial has a figure")
