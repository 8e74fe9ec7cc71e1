"""Helpers for the campaign tests: gate and bench as the CLI runs them."""

from __future__ import annotations


def run_bench(cfg, model: str, spec, launch: bool = False, **kw):
    """`servedeck bench` as the CLI runs it: open the target, the coroutine on the client's loop
    (uvloop when installed), close."""
    from servedeck.workloads.session import Outcome, measured, run as bench
    from servedeck.loadgen.loop import run as run_loop

    out = Outcome()
    with measured(cfg, model, launch, out) as target:
        return run_loop(bench(target, spec, outcome=out, **kw))


def run_gate(cfg, model: str, spec, launch: bool = False, **kw):
    import asyncio

    from servedeck.workloads.session import Outcome, gate, measured

    out = Outcome()
    with measured(cfg, model, launch, out) as target:
        return asyncio.run(gate(target, spec, outcome=out, **kw))
