"""Every run on one server from start to finish: target, run folder, gate, the kind's measuring, verdict, summary.

    servedeck gate MODEL            → gate      (the needle into a run folder; gate_run: any gate kind)
    servedeck bench MODEL --workload K, a campaign cell's workload, `servedeck ramp`
                                    → run       (gate, or cite this launch's, then KINDS[spec.kind]'s run)

Every kind runs the same way (workloads/kinds.py finds it by the spec's `kind`): the served context read, the
spec fitted to it (`Kind.fitted`: refused before anything is written when it cannot run here), the run folder
opened (named by the campaign's labels, secrets scrubbed from the log it copies), the gates of this launch
cited or the needle run, then `Kind.run` into the folder. Every way a run can end writes its folder's final state
before the error travels on:
    finished            status ok
    the kind's failure  status failed, reason as the kind said (requests failed: how many and the first error)
    server died         status failed, reason says how (exit code or signal, from the launch folder)
    Ctrl-C              status failed, reason "interrupted"; CancelledError/KeyboardInterrupt propagate
An engine this run started (--launch) is stopped afterwards, whatever happened:

    with measured(cfg, "smollm2", launch=True, outcome=out) as target:
        asyncio.run(session.run(target, spec, outcome=out))
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from servedeck.config import Config
from servedeck.deck.deck import settings_of
from servedeck.errors import ServedeckError
from servedeck.gates.kinds import Gate, cites, views
from servedeck.gates.niah import GateResult, GateSpec, NeedleGate, ProbeResult
from servedeck.report.render import markdown
from servedeck.runs import inventory
from servedeck.runs.folder import RunFolder, runs_root
from servedeck.runs.read import list_runs, load, summary_of
from servedeck.watch.notices import Redactor
from servedeck.workloads.gating import cite_gate, run_gate_into
from servedeck.workloads.kinds import of_spec
from servedeck.workloads.reporter import QuietReporter, Reporter
from servedeck.workloads.target import Target, close_target, open_target


@dataclass
class Outcome:
    """Filled in as the run goes, so a caller still knows the folder after Ctrl-C."""

    folder: Optional[Path] = None
    gate: Optional[GateResult] = None
    target: Optional[Target] = None


def _root(cfg: Config) -> Path:
    return runs_root(cfg.deck.host.results_dir)


def base_summary(target: Target, context: int, kind: str, workload: dict[str, Any]) -> dict[str, Any]:
    model = target.cfg.models[target.name]
    rec = target.record
    boot = rec.boot
    settings = settings_of(target.name, target.cfg)
    settings.pop("since", None)
    return {
        "kind": kind, "model": target.model_label, "engine": target.engine, "layout": target.layout_label,
        "model_entry": target.name,
        "context": context, "configured_context": model.context, "served_name": target.served_name,
        "base_url": target.base_url,
        "launch": {"launch_dir": target.launch_dir, "started_at": rec.started_at,
                   "ready_at": rec.ready_at, "pid": rec.pid, "engine_pid": rec.engine_pid,
                   "launched_by_run": target.launched},
        "versions": inventory.versions(target.base_url, target.engine, boot,
                                       target.cfg.deck.builds.get(model.build)),
        "host": inventory.host(), "gpus": inventory.gpus(),
        "config": settings, "command": rec.spec.get("argv"), "boot": boot,
        "workload": workload, "gate": {"status": "pending"}, "points": [],
        **target.extra,
    }


def _fitted(target: Target, gate: Gate, served: int) -> Gate:
    return gate.fitted(served, target.cfg.models[target.name].max_output_tokens, target.name)


async def _gate_into(folder: RunFolder, target: Target, gate: NeedleGate, reporter: Reporter,
                     outcome: Outcome) -> GateResult:
    """The needle (fitted) into `folder`, told probe by probe to the reporter."""
    reporter.gate_start(gate.check(target.engine), gate.spec.context)
    result = await run_gate_into(folder, target, gate, lambda line: reporter.gate_probe(ProbeResult.from_line(line)))
    outcome.gate = GateResult.from_json(result)
    return outcome.gate


def gates_of_launch(root: Path, launch_dir: Optional[str], context: int) -> dict[str, Path]:
    """Each gate run on this very launch of the server, by name: the latest run that ran it and finished it
    (a needle only at this context)."""
    found: dict[str, Path] = {}
    if not launch_dir:
        return found
    for path in reversed(list_runs(root)):
        summary = summary_of(path)
        if (summary.get("launch") or {}).get("launch_dir") != launch_dir:
            continue
        for name, view in views(path, summary).items():
            if name not in found and cites(view, context):
                found[name] = path
    return found


def _finish(folder: RunFolder, status: str, reason: Optional[str]) -> None:
    folder.finish(status, reason)
    try:
        folder.write_markdown(markdown(load(folder.path)))
    except Exception as e:  # the summary.json verdict matters more than its prose
        folder.update(markdown_error=f"{type(e).__name__}: {e}")


def _guarded(folder: RunFolder, work: Any) -> Any:
    """Run `work` (a coroutine) and settle the folder however it ends."""
    async def inner() -> Any:
        try:
            result = await work
        except asyncio.CancelledError:
            _finish(folder, "failed", "interrupted (Ctrl-C); every finished request and probe is kept")
            raise
        except ServedeckError as e:
            _finish(folder, "failed", e.message)
            raise
        except Exception as e:
            _finish(folder, "failed", f"servedeck failed: {type(e).__name__}: {e}")
            raise
        return result
    return inner()


# --- gate -------------------------------------------------------------------------------------

async def gate_run(target: Target, gate: Gate, outcome: Outcome,
                   on_sample: Optional[Callable[[dict[str, Any]], None]] = None,
                   on_start: Optional[Callable[[Gate], None]] = None) -> dict[str, Any]:
    """A run folder (kind "gate") of one gate of any kind, fitted to the running server: its record and its
    verdict. Ends as every run does (finished → ok; server died, Ctrl-C → failed, every scored sample kept)."""
    gate.check(target.engine)
    ctx = await target.served_context()
    gate = _fitted(target, gate, ctx)
    if on_start:
        on_start(gate)
    folder = RunFolder.create(_root(target.cfg), target.model_label, target.layout_label,
                              target.cfg.models[target.name].context or ctx, target.engine,
                              base_summary(target, ctx, "gate", {"gate": gate.spec_json()}))
    outcome.folder = folder.path
    folder.scrub = Redactor.from_config(target.cfg).text
    folder.attach_launch(target.launch_dir, whole_log=target.launched)

    async def work() -> dict[str, Any]:
        result = await run_gate_into(folder, target, gate, on_sample)
        _finish(folder, "ok", None)
        return result

    return await _guarded(folder, work())


@contextmanager
def measured(cfg: Config, model: str, launch: bool, outcome: Outcome) -> Iterator[Target]:
    """The server a gate or bench measures, for the length of the block: the running model, or (with
    `launch`) one started through the deck now and stopped when the block ends, whatever happened.
    Blocking on purpose, outside any event loop: a Ctrl-C during a boot reaches the deck, which stops
    the half-started engine."""
    target = open_target(cfg, model, launch)
    outcome.target = target
    try:
        yield target
    finally:
        close_target(target)


async def gate(target: Target, spec: GateSpec, *, reporter: Optional[Reporter] = None,
               outcome: Optional[Outcome] = None) -> Outcome:
    """`servedeck gate`: a run folder holding niah.log and its verdict. spec.context 0 = the server's."""
    outcome = outcome or Outcome(target=target)
    reporter = reporter or QuietReporter()
    result = await gate_run(target, NeedleGate(spec), outcome,
                            lambda line: reporter.gate_probe(ProbeResult.from_line(line)),
                            lambda g: reporter.gate_start(g.check(), g.spec.context))
    outcome.gate = GateResult.from_json(result)
    return outcome


async def run_accuracy(target: Target, gate: Gate, *, outcome: Optional[Outcome] = None,
                       on_sample: Optional[Callable[[dict[str, Any]], None]] = None,
                       stage: Optional[Callable[[str], None]] = None) -> Outcome:
    """`servedeck gate MODEL --eval …`: an accuracy gate (gates/kinds.py) into a run folder of its own, a gate run
    like the needle's: summary.json `gates.eval` says what was asked and its verdict, eval.jsonl holds one scored
    line per question (gates/samples.py), the lm-eval kind keeps lm-eval's own results under lm-eval/. Every later
    run on the same launch cites this folder, so a failed accuracy gate marks their points as not results."""
    outcome = outcome or Outcome(target=target)

    def started(g: Any) -> None:
        if stage:
            stage(f"gate {g.name} ({g.kind}): {g.spec_json().get('path') or g.spec_json().get('task')}")

    await gate_run(target, gate, outcome, on_sample, started)
    return outcome


# --- a workload of any kind ------------------------------------------------------------------------------------

def _open_run(target: Target, ctx: int, workload: dict[str, Any], gate_spec: GateSpec, gate_mode: Optional[bool],
              outcome: Outcome, **summary: Any) -> tuple[RunFolder, GateSpec, dict[str, Path]]:
    """The run folder a workload writes into (named by the campaign's labels, secrets scrubbed from the
    log it copies), the needle sized to the served context, and the gates already run on this launch."""
    gate_spec = NeedleGate(gate_spec).fitted(ctx, None, target.name).spec
    model = target.cfg.models[target.name]
    root = _root(target.cfg)
    inherited = gates_of_launch(root, target.launch_dir, gate_spec.context)
    if gate_mode is True:  # --gate: a needle of its own, whatever ran before
        inherited.pop(NeedleGate.name, None)
    folder = RunFolder.create(root, target.model_label, target.layout_label, model.context or ctx, target.engine,
                              {**base_summary(target, ctx, "bench", workload), **summary})
    outcome.folder = folder.path
    folder.scrub = Redactor.from_config(target.cfg).text
    folder.attach_launch(target.launch_dir, whole_log=target.launched)
    return folder, gate_spec, inherited


async def _gate_or_inherit(folder: RunFolder, target: Target, gate_mode: Optional[bool], gate_spec: GateSpec,
                           inherited: dict[str, Path], reporter: Reporter, outcome: Outcome) -> None:
    """Every gate run on this launch is a fact about it: cited (its evidence copied in, its source named);
    then the needle, unless cited or --no-gate."""
    for name, run in inherited.items():
        cite_gate(folder, run, name)
    needle = NeedleGate(gate_spec)
    if needle.name in inherited:
        return
    if gate_mode is False:
        folder.update(gate={"status": "not run", "note": "--no-gate, and no gate was run on this launch"})
        return
    result = await _gate_into(folder, target, needle, reporter, outcome)  # sized by _open_run
    if not result.passed:
        reporter.stage(f"gate failed (score {round(result.score, 2)} < {result.threshold}): "
                       "the figures below are recorded but marked as not a result")


async def run(target: Target, spec: Any, *, gate_mode: Optional[bool] = None, gate_spec: Optional[GateSpec] = None,
              reporter: Optional[Reporter] = None, outcome: Optional[Outcome] = None) -> Outcome:
    """`spec` (of any kind) on `target`: gate (run, or inherited from this launch), then the kind's run, into one
    run folder.

    gate_mode None: reuse a gate already run on this launch, else run one; True: always run one;
    False: run none (a gate already run on this launch is still recorded, and said to be cited).
    """
    outcome = outcome or Outcome(target=target)
    reporter = reporter or QuietReporter()
    kind = of_spec(spec)
    ctx = await target.served_context()
    spec = kind.fitted(spec, target, ctx)
    # prompt_seed: runs with the same one sent the same prompts (compare pairs them request by request)
    seed = spec.prompt_seed if hasattr(spec, "prompt_seed") else getattr(spec, "seed", None)
    folder, gate_spec, inherited = _open_run(target, ctx, spec.to_json(), gate_spec or GateSpec(context=0), gate_mode,
                                             outcome, prompt_seed=seed)

    async def work() -> None:
        await _gate_or_inherit(folder, target, gate_mode, gate_spec, inherited, reporter, outcome)
        failed = await kind.run(spec, target, ctx, folder, reporter)
        _finish(folder, "failed" if failed else "ok", failed)

    await _guarded(folder, work())
    return outcome
