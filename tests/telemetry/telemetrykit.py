"""Helpers for the telemetry tests: a bench and a ramp as the CLI runs them."""

from __future__ import annotations


def run_bench(cfg, model: str, spec, **kw):
    """`servedeck bench` on a server the deck already runs, on the client's loop (as campaignkit's)."""
    from servedeck.workloads.session import Outcome, measured, run as bench
    from servedeck.loadgen.loop import run as run_loop

    out = Outcome()
    with measured(cfg, model, False, out) as target:
        return run_loop(bench(target, spec, outcome=out, **kw))


def run_ramp(cfg, model: str, spec, **kw):
    from servedeck.workloads.session import Outcome, measured, run as ramp
    from servedeck.loadgen.loop import run as run_loop

    out = Outcome()
    with measured(cfg, model, False, out) as target:
        return run_loop(ramp(target, spec, outcome=out, **kw))
