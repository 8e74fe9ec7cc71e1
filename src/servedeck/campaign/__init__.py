"""The campaign: gate a server, benchmark it, and record every run in a folder.

    servedeck gate MODEL    → session.gate   (gates.niah into a run folder)
    servedeck bench MODEL   → session.bench  (gate, then one loadgen point per concurrency or rate)

Both are coroutines on a `Target` that `session.measured(cfg, model, launch, outcome)` opens (starting
the model through the deck when asked) and closes; the caller owns the event loop:

    with measured(cfg, "smollm2", launch=True, outcome=out) as target:
        asyncio.run(bench(target, spec, outcome=out))
"""

from servedeck.campaign.bench import BenchSpec
from servedeck.errors import ServerDied
from servedeck.campaign.reporter import QuietReporter, Reporter
from servedeck.campaign.session import Outcome, bench, gate, measured

__all__ = ["BenchSpec", "Outcome", "QuietReporter", "Reporter", "ServerDied", "bench", "gate", "measured"]
