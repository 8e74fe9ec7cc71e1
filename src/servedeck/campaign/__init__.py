"""The campaign: gate a server, benchmark it, and record every run in a folder.

    servedeck gate MODEL    → session.gate   (gates.niah into a run folder)
    servedeck bench MODEL   → session.bench  (gate, then one loadgen point per concurrency or rate)
    servedeck bench MODEL --workload ramp → session.ramp (gate, then one conversation grown to its cut-off)
    servedeck compare-outputs A B → outputs.compare_runs (greedy outputs of two launches, token by token)

They are coroutines on a `Target` that `session.measured(cfg, model, launch, outcome)` opens (starting
the model through the deck when asked) and closes; the caller owns the event loop:

    with measured(cfg, "smollm2", launch=True, outcome=out) as target:
        asyncio.run(session.bench(target, spec, outcome=out))

`gate`, `bench` and `ramp` are reached through `session`, not re-exported here: a package attribute
`bench` or `ramp` would hide the modules bench.py and ramp.py (`servedeck.campaign.bench` was the function,
whatever was imported).
"""

from servedeck.campaign.bench import BenchSpec
from servedeck.errors import ServerDied
from servedeck.campaign.reporter import QuietReporter, Reporter
from servedeck.campaign.outputs import compare_runs
from servedeck.campaign.ramp import RampSpec
from servedeck.campaign import session
from servedeck.campaign.session import Outcome, measured

__all__ = ["BenchSpec", "Outcome", "QuietReporter", "RampSpec", "Reporter", "ServerDied", "compare_runs", "measured",
           "session"]
