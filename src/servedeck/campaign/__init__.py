"""The campaign: gate a server, benchmark it, and record every run in a folder.

    servedeck gate MODEL    → session.gate   (gates.niah into a run folder)
    servedeck bench MODEL   → session.bench  (gate, then one loadgen point per concurrency or rate)
    servedeck bench MODEL --workload ramp → session.ramp (gate, then one conversation grown to its cut-off)
    servedeck compare-outputs A B → outputs.compare_runs (greedy outputs of two launches, token by token)
"""

from servedeck.campaign.bench import BenchSpec, ServerDied
from servedeck.campaign.reporter import QuietReporter, Reporter
from servedeck.campaign.outputs import compare_runs
from servedeck.campaign.ramp import RampSpec
from servedeck.campaign.session import Outcome, bench, gate, ramp

__all__ = ["BenchSpec", "Outcome", "QuietReporter", "RampSpec", "Reporter", "ServerDied", "bench", "compare_runs",
           "gate", "ramp"]
