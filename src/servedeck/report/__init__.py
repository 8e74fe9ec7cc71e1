"""Rendering runs for people: one run (render.py: summary.md, `show`, the `runs` list), and many runs
(`servedeck report` and `compare`):

    collect.py   run folders / a campaign folder → variants, repeats, failures
    knobs.py     what a run was made with, flat, for "what changed"
    stats.py     paired/unpaired bootstrap, intervals across repeats, drift
    attribution.py  which knob a difference is credited to: a campaign's own, its rendered consequences
    compare.py   A vs B: changes, attribution, verdicts
    caveats.py   not a result, a busy host at a launch's start, the runs' own warnings
    pareto.py    load points across repeats, the frontier
    plots.py     matplotlib → inline SVG
    sections.py  the report's sections (one function each) → blocks.py → report.md / html.py
    build.py     writes both; copies the sources in when the report sits outside their results tree
"""

from typing import Any

_RENDER = ("banner", "gate_cell", "headline_cell", "list_row", "markdown")


def __getattr__(name: str) -> Any:
    # render.py is read on first use: it shows each workload kind's figures (workloads/kinds.py), and the kinds
    # format theirs with report/text.py, which must not load every kind with this package
    if name in _RENDER:
        from servedeck.report import render

        return getattr(render, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["banner", "gate_cell", "headline_cell", "list_row", "markdown"]
