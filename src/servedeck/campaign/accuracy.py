"""`servedeck gate MODEL --eval …`: an accuracy gate (gates/kinds.py) into a run folder of its own.

The folder is a gate run (kind "gate") like the needle's: summary.json `gates.eval` says what was asked
and its verdict, eval.jsonl holds one scored line per question (gates/samples.py), and the lm-eval kind
keeps lm-eval's own results and samples under lm-eval/. Every later run on the same launch cites this
folder (campaign/gating.py), so a failed accuracy gate marks their points as not results. `campaign_gates`:
the gates a campaign cell runs, the needle among them.

Endings, as for every run (campaign/session.py): finished → ok; the server died → failed naming how;
Ctrl-C → failed, every scored question kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from servedeck.campaign.session import Outcome, gate_run
from servedeck.campaign.target import Target
from servedeck.errors import UsageError
from servedeck.gates.kinds import AccuracyGate, Gate, accuracy_gate
from servedeck.gates.niah import GateSpec, NeedleGate


async def run_accuracy(target: Target, gate: AccuracyGate, *, outcome: Optional[Outcome] = None,
                       on_sample: Optional[Callable[[dict[str, Any]], None]] = None,
                       stage: Optional[Callable[[str], None]] = None) -> Outcome:
    """Check the gate's input, open its run folder, ask every question, record the verdict
    (campaign/session.py `gate_run`, as for every kind)."""
    outcome = outcome or Outcome(target=target)

    def started(g: Any) -> None:
        if stage:
            stage(f"gate {g.name} ({g.kind}): {g.spec_json().get('path') or g.spec_json().get('task')}")

    await gate_run(target, gate, outcome, on_sample, started)
    return outcome


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
