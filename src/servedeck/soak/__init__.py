"""Soak runs: hold a model under steady load with saturation bursts for hours; stop at the first fault."""

from servedeck.soak.conversation import Conversation, ProtocolViolation
from servedeck.soak.run import SoakSpec, concurrency_cap, foreign_gpu_processes, open_soak, preflight

__all__ = ["Conversation", "ProtocolViolation", "SoakSpec", "concurrency_cap", "foreign_gpu_processes",
           "open_soak", "preflight"]
