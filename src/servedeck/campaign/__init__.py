"""The campaign: gate a server, benchmark it, and record every run in a folder.

    servedeck gate MODEL    → session.gate   (gates.niah into a run folder)
    servedeck bench MODEL   → session.bench  (gate, then one loadgen point per concurrency or rate)
    servedeck bench MODEL --workload ramp → session.ramp (gate, then one conversation grown to its cut-off)
    servedeck compare-outputs A B → outputs.compare_runs (greedy outputs of two launches, token by token)

Both are coroutines on a `Target` that `session.measured(cfg, model, launch, outcome)` opens (starting
the model through the deck when asked) and closes; the caller owns the event loop:

    with measured(cfg, "smollm2", launch=True, outcome=out) as target:
        asyncio.run(bench(target, spec, outcome=out))
"""

from servedeck.campaign.bench import BenchSpec
from servedeck.errors import ServerDied
from servedeck.campaign.reporter import QuietReporter, Reporter
from servedeck.campaign.outputs import compare_runs
from servedeck.campaign.ramp import RampSpec
from servedeck.campaign.session import Outcome, bench, gate, measured, ramp

__all__ = ["BenchSpec", "Outcome", "QuietReporter", "RampSpec", "Reporter", "ServerDied", "bench", "compare_runs",
           "gate", "measured", "ramp"]
