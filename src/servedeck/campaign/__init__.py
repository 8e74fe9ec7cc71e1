"""The campaign: gate a server, benchmark it, and record every run in a folder.

    servedeck gate MODEL    → session.gate   (gates.niah into a run folder)
    servedeck bench MODEL   → session.bench  (gate, then one loadgen point per concurrency or rate)
"""

from servedeck.campaign.bench import BenchSpec, ServerDied
from servedeck.campaign.reporter import QuietReporter, Reporter
from servedeck.campaign.session import Outcome, bench, gate

__all__ = ["BenchSpec", "Outcome", "QuietReporter", "Reporter", "ServerDied", "bench", "gate"]
