"""Correctness gates: checks a server must pass before its performance numbers count as results (the
needle here; the kinds, accuracy gates among them, in gates/kinds.py)."""

from servedeck.gates.niah import GateResult, GateSpec, ProbeResult, read_log, run_gate, score

__all__ = ["GateResult", "GateSpec", "ProbeResult", "read_log", "run_gate", "score"]
