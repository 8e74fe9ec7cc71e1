"""The gates a campaign cell runs (`campaign_gates`: the needle, then `gate.eval`), from the campaign file's
[campaign] gate keys, and their input checked before the first launch (`check_campaign_gate`). Each runs into a
run folder of its own through workloads/session.py's `gate_run`, as `servedeck gate` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from servedeck.errors import UsageError
from servedeck.gates.kinds import AccuracyGate, Gate, accuracy_gate
from servedeck.gates.niah import GateSpec, NeedleGate


def campaign_gates(camp: Any) -> list[Gate]:
    """Every gate the campaign names, in the order a cell runs them: the needle (`gate.niah`, or its keys
    directly in `gate`), then `gate.eval`."""
    needle = camp.head.gate.needle if camp.head.gate else None
    gates: list[Gate] = []
    if needle:
        gates.append(NeedleGate(GateSpec(context=needle.context, depths=tuple(needle.depths), repeats=needle.repeats,
                                         threshold=needle.threshold, seed=needle.seed)))
    accuracy = campaign_gate(camp)
    return gates + ([accuracy] if accuracy is not None else [])


def campaign_gate(camp: Any) -> Optional[AccuracyGate]:
    """The campaign's `gate.eval` as a gate (its paths relative to the campaign file), or None."""
    g = camp.head.gate.eval if camp.head.gate else None
    if g is None:
        return None
    return accuracy_gate(g.ref, g.threshold, limit=g.limit, concurrency=g.concurrency, task_dir=g.task_dir,
                         answer_tokens=g.answer_tokens, base=Path(camp.path).parent, where="gate.eval")


def check_campaign_gate(camp: Any, engine: Optional[str]) -> None:
    """`campaign run`: a bad question file, task or threshold is refused before the first launch."""
    gate = campaign_gate(camp)
    if gate is not None:
        try:
            gate.check(engine)
        except UsageError as e:
            raise UsageError(f"{camp.path}: gate.eval: {e.message}", hint=e.hint) from None
