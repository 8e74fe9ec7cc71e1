"""`servedeck gate MODEL --eval …`: an accuracy gate (gates/kinds.py) into a run folder of its own.

The folder is a gate run (kind "gate") like the needle's: summary.json `gates.eval` says what was asked
and its verdict, eval.jsonl holds one scored line per question (gates/samples.py), and the lm-eval kind
keeps lm-eval's own results and samples under lm-eval/. A campaign cites this folder from every bench
run of the same launch (`cited`), so a failed accuracy gate marks their points as not results.

Endings, as for every run (campaign/session.py): finished → ok; the server died → failed naming how;
Ctrl-C → failed, every scored question kept.
"""

from __future__ import annotations

from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Optional

from servedeck.campaign.session import Outcome, _finish, _guarded, _root, _served_context, base_summary
from servedeck.campaign.target import Target
from servedeck.errors import RunError, ServerDied, UsageError
from servedeck.gates import samples as S
from servedeck.gates.kinds import AccuracyGate, accuracy_gate
from servedeck.runs.folder import RunFolder
from servedeck.runs.read import summary_of
from servedeck.watch.notices import Redactor


def _entry(gate: AccuracyGate, status: str, **more: Any) -> dict[str, Any]:
    return {gate.name: {"kind": gate.kind, "status": status, "source": "this run", "file": S.FILE,
                        "spec": gate.spec_json(), **more}}


async def run_accuracy(target: Target, gate: AccuracyGate, *, outcome: Optional[Outcome] = None,
                       on_sample: Optional[Callable[[dict[str, Any]], None]] = None,
                       stage: Optional[Callable[[str], None]] = None) -> Outcome:
    """Check the gate's input, open its run folder, ask every question, record the verdict."""
    outcome = outcome or Outcome(target=target)
    gate.check(target.engine)
    ctx = await _served_context(target)
    model = target.cfg.models[target.name]
    folder = RunFolder.create(_root(target.cfg), target.model_label, target.layout_label, model.context or ctx,
                              target.engine, base_summary(target, ctx, "gate", {"gate": gate.spec_json()}))
    outcome.folder = folder.path
    folder.scrub = Redactor.from_config(target.cfg).text
    folder.attach_launch(target.launch_dir, whole_log=target.launched)
    folder.update(gate={"status": "not run", "note": "an accuracy gate only (no needle asked for)"},
                  gates=_entry(gate, "running"))

    def record(line: dict[str, Any]) -> None:
        folder.append_jsonl(S.FILE, line)
        if on_sample:
            on_sample(line)

    async def work() -> dict[str, Any]:
        if stage:
            stage(f"gate {gate.name} ({gate.kind}): {gate.spec_json().get('path') or gate.spec_json().get('task')}")
        t0 = perf_counter()
        try:
            result = await gate.run(target.server, folder.path, record)
        except RunError as e:
            death = target.death()
            raise (ServerDied(death) if death else e) from None
        wall = round(perf_counter() - t0, 2)
        folder.update(gates=_entry(gate, "passed" if result["passed"] else "failed", result=result, wall_s=wall))
        death = target.death()
        if death:
            raise ServerDied(f"{death} (during the {gate.name} gate)")
        _finish(folder, "ok", None)
        return result

    await _guarded(folder, work())
    return outcome


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


def cited_from(gate_run: Optional[Path], gate: AccuracyGate) -> dict[str, Any]:
    """What each bench run of the same launch records about this gate: where its samples are, so their
    figures stand or fall with it."""
    status = ((summary_of(gate_run).get("gates") or {}).get(gate.name) or {}).get("status") if gate_run else None
    return {gate.name: {"kind": gate.kind, "status": status or "failed", "source": gate_run.name if gate_run else None,
                        "file": S.FILE, "spec": gate.spec_json(), "note": "gate run on this same launch of the server"}}
