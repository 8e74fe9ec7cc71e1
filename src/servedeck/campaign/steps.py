"""A cell's steps, wherever it runs: launch each replica through the deck → gate (a run folder per
replica) → each workload (a run folder, inheriting the gate of this launch) → the engines stopped.

The runner (runner.py) decides when a cell runs and records how it ends; a placement decides where
(this process's threads, or a Ray node). Both call these steps and neither repeats them: a new workload
kind, gate kind or per-point sampler changes this module (and what it calls), not a placement. The
steps report through `CellNews`, the same on a Ray node as on this host.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from servedeck.campaign import cells as C
from servedeck.campaign.accuracy import campaign_gates
from servedeck.campaign.bench import DEFAULTS, BenchSpec
from servedeck.campaign.capacity import campaign_specs as capacity_specs, capacity as capacity_on_target
from servedeck.campaign.conversation_keys import spec_of as conversation_spec
from servedeck.campaign.conversations import conversations as conversations_on_target
from servedeck.campaign.replay_keys import spec_for as replay_spec
from servedeck.campaign.shared_prefix import shared_prefix as shared_prefix_on_target
from servedeck.campaign.trace import trace as trace_on_target
from servedeck.campaign.file import Campaign, WorkloadCfg
from servedeck.campaign.reporter import QuietReporter
from servedeck.campaign.session import Outcome, bench as bench_on_target, gate_run
from servedeck.campaign.target import Target, layout_facts
from servedeck.deck import Deck
from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.deck import settings_of
from servedeck.errors import LaunchError, ServedeckError
from servedeck.gates.niah import GateSpec
from servedeck.loadgen import ClosedLoop, OpenLoop
from servedeck.report.render import markdown
from servedeck.runs import inventory
from servedeck.runs.folder import RunFolder
from servedeck.runs.read import load as load_run
from servedeck.supervisor import process as P
from servedeck.timeparse import seconds

LOCK_WAIT_S = 3600.0  # parallel cells queue for the deck lock while another one boots


class CellNews(Protocol):
    """What a cell's work tells the runner that keeps the campaign's record: the same four calls from a
    thread here as from a Ray node (the head replays each node's stream onto them)."""

    def phase(self, cell: str, text: str) -> None: ...  # what the cell does now
    def note(self, text: str) -> None: ...  # something the user should read
    def run_made(self, cell: str, run: str) -> None: ...  # a run folder of this cell exists (its name here)
    def placed(self, cell: str, **fields: Any) -> None: ...  # where it runs: node, ray_node_id, node_gpus, attempts


def bench_spec(w: WorkloadCfg) -> BenchSpec:
    """A [[workloads]] entry → what `servedeck bench` would run, with the same defaults."""
    if w.rate:
        shapes: tuple[Any, ...] = tuple(OpenLoop(r, w.arrivals) for r in w.rate)
    else:
        shapes = tuple(ClosedLoop(c) for c in (w.concurrency or [1]))
    default = DEFAULTS[w.kind]  # the same per-workload defaults as `servedeck bench`'s
    duration_s = seconds(w.duration, "duration") if w.duration else None
    requests = w.requests
    if duration_s is None and requests is None:
        duration_s, requests = default.duration_s, default.requests
    return BenchSpec(workload=w.kind, shapes=shapes, output_tokens=w.output_tokens or default.output_tokens,
                     input_tokens=w.input_tokens if w.kind == "chat" else None,
                     prompt_tokens=w.prompt_tokens if w.kind == "long-prompt" else None,
                     duration_s=duration_s, requests=requests, warmup=w.warmup, seed=w.seed,
                     client_procs=w.client_procs)


class CellSteps:
    """The steps of this campaign's cells on this host's deck. `derived`: the model entries as the
    cell's engines are to be rendered (on a Ray node: rewritten to the GPUs Ray granted). `folder`: the
    campaign folder's name, as every run's summary.json cites it. `node`: where the steps run."""

    def __init__(self, derived: C.Derived, camp: Campaign, runs_root: Path, folder: str, node: dict[str, Any],
                 evict: bool):
        self.derived, self.camp, self.runs_root, self.folder, self.node = derived, camp, runs_root, folder, node
        self.evict = evict
        self.deck = Deck(derived.cfg)
        self.ours = {n for names in derived.models.values() for n in names}

    def running(self) -> dict[str, dict[str, Any]]:
        return {n: r.to_json() for n, r in self.deck.running().items()}

    def run(self, cell: C.Cell, news: CellNews, stopping: Callable[[], bool]) -> C.Ending:
        """Launch, gate, measure; `stopping()` says the cell is being stopped (Ctrl-C, cell_timeout)."""
        head = self.camp.head
        held = C.holders_in_the_way(cell, self.running(), self.ours) if self.evict else []
        if held:
            news.phase(cell.id, f"evicting {', '.join(held)}")
        targets: list[Target] = []
        extra = self._extra(cell)
        for i, name in enumerate(cell.models):
            news.phase(cell.id, f"launching {name}" + (f" (replica {i + 1}/{len(cell.models)})"
                                                       if len(cell.models) > 1 else ""))
            try:
                rec = self.deck.start(name, wait_s=LOCK_WAIT_S, reason=f"campaign {self.camp.name}",
                                      evict=held if i == 0 else ()).record
            except LaunchError as e:
                news.run_made(cell.id, self._failed_launch(cell, name, e, extra))
                return C.Ending(C.CellState.FAILED, e.message,
                                (e.cause or {}).get("signature") or (e.cause or {}).get("id"))
            targets.append(Target(name, self.derived.cfg, rec, launched=True, run_model=self.derived.base,
                                  run_layout=cell.variant, extra=extra))
            if stopping():
                return C.Ending(C.CellState.FAILED, "stopped while launching")
        main = targets[0]
        main.peers = targets[1:]
        needle = head.gate.needle if head.gate else None
        gate_ctx = needle.context if needle else 0
        # every gate, a run folder each, after boot and before any workload (the workloads cite them: session.py);
        # a kind that checks each launch (the needle) runs on every replica, the others on the first
        for gate in campaign_gates(self.camp):
            on = targets if gate.every_replica else targets[:1]
            for i, t in enumerate(on):
                news.phase(cell.id, f"gate {gate.name}" + (f" (replica {i + 1})" if len(on) > 1 else ""))
                _one_run(cell, news, lambda out, t=t, gate=gate: gate_run(t, gate, out))
        for k, w in enumerate(self.camp.file.workloads):
            news.phase(cell.id, f"workload {w.title}")
            if w.kind == "capacity":  # one search (one run folder) per SLO it names
                for cspec in capacity_specs(w, self.camp.slos):
                    news.phase(cell.id, f"workload {w.title}: {cspec.find} under {cspec.slo.name}")
                    _one_run(cell, news, lambda out, cspec=cspec: capacity_on_target(
                        main, cspec, gate_mode=None if needle else False, gate_spec=GateSpec(context=gate_ctx),
                        reporter=_PhaseReporter(news, cell.id), outcome=out))
                continue
            if w.kind == "conversations":  # one run folder of every user's conversation
                _one_run(cell, news, lambda out, w=w: conversations_on_target(
                    main, conversation_spec(w), gate_mode=None if needle else False,
                    gate_spec=GateSpec(context=gate_ctx), reporter=_PhaseReporter(news, cell.id), outcome=out))
                continue
            if w.kind in ("shared-prefix", "trace"):  # one run folder each, one point of its own
                run = shared_prefix_on_target if w.kind == "shared-prefix" else trace_on_target
                _one_run(cell, news, lambda out, w=w, run=run: run(
                    main, replay_spec(w, self.camp.path), gate_mode=None if needle else False,
                    gate_spec=GateSpec(context=gate_ctx), reporter=_PhaseReporter(news, cell.id), outcome=out))
                continue
            spec = bench_spec(w)
            if head.reference and k == 0:  # the fixed greedy prompts, compared with the reference variant's
                spec = replace(spec, check_outputs=True, check_prompts=head.reference_prompts,
                               check_tokens=head.reference_tokens)
            _one_run(cell, news, lambda out, spec=spec: bench_on_target(
                main, spec, gate_mode=None if needle else False, gate_spec=GateSpec(context=gate_ctx),
                reporter=_PhaseReporter(news, cell.id), outcome=out))
        return C.Ending(C.CellState.DONE)

    def kill(self, cell: C.Cell) -> None:
        """Stop a cell's engines from outside its thread (timeout, Ctrl-C): their group, then the deck settles."""
        for name in cell.models:
            rec = S.read_live(name)
            if rec and P.alive(rec.pid, rec.create_time):
                P.stop_group(rec.pgid, 10.0)

    def stop(self, cell: C.Cell, news: CellNews) -> None:
        try:  # the deck's stop also drops them from desired state: `restore` never brings a cell back
            self.deck.stop(list(cell.models), wait_s=LOCK_WAIT_S)
        except ServedeckError as e:
            news.note(f"{cell.id}: stopping its engines: {e.message}")

    def _extra(self, cell: C.Cell) -> dict[str, Any]:
        ms = [self.derived.cfg.models[n] for n in cell.models]
        return {"campaign": {"name": self.camp.name, "folder": self.folder, "variant": cell.variant,
                             "repeat": cell.repeat, "cell": cell.id},
                **layout_facts(ms), "node": dict(self.node)}

    def _failed_launch(self, cell: C.Cell, name: str, err: LaunchError, extra: dict[str, Any]) -> str:
        """A launch that never came up is a result too: a run folder with its engine log and the cause."""
        cfg = self.derived.cfg
        model = cfg.models[name]
        engine = cfg.deck.builds[model.build].engine
        launches = L.past_launches(name)
        launch_dir = launches[-1] if launches else None
        lrec = L.read_launch(launch_dir) if launch_dir else {}
        settings = settings_of(name, cfg)
        settings.pop("since", None)
        summary = {"kind": "launch", "model": self.derived.base, "model_entry": name, "engine": engine,
                   "layout": cell.variant, "context": model.context, "configured_context": model.context,
                   "served_name": model.served_name, "launch": {"launch_dir": str(launch_dir) if launch_dir else None,
                                                                "started_at": lrec.get("started_at"),
                                                                "launched_by_run": True},
                   "host": inventory.host(), "gpus": inventory.gpus(), "config": settings,
                   "command": (lrec.get("spec") or {}).get("argv"), "workload": {},
                   "gate": {"status": "not run", "note": "the server never came up"}, "points": [],
                   "cause": err.cause or lrec.get("cause"), "end_detail": lrec.get("end_detail"), **extra}
        folder = RunFolder.create(self.runs_root, self.derived.base, cell.variant, model.context, engine, summary)
        folder.attach_launch(str(launch_dir) if launch_dir else None, whole_log=True)
        folder.finish("failed", err.message)
        try:
            folder.write_markdown(markdown(load_run(folder.path)))
        except Exception as e:
            folder.update(markdown_error=f"{type(e).__name__}: {e}")
        return folder.path.name


def _one_run(cell: C.Cell, news: CellNews, work: Callable[["_Listed"], Any]) -> "_Listed":
    """Run one coroutine that makes a run folder for the cell (`work(outcome)`), telling the news of the
    folder as soon as it exists and again when the work ends, however it ends."""
    out = _Listed(lambda run: news.run_made(cell.id, run))
    try:
        asyncio.run(work(out))
    finally:
        if out.folder is not None:
            news.run_made(cell.id, out.folder.name)
    return out


class _Listed(Outcome):
    """An Outcome that lists its run folder in campaign.json the moment the session creates it."""

    def __init__(self, on_folder: Any) -> None:
        super().__init__()
        self._on_folder = on_folder

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, value)
        if key == "folder" and value is not None and getattr(self, "_on_folder", None) is not None:
            self._on_folder(value.name)


class _PhaseReporter(QuietReporter):
    """A gate's or bench's own progress, as the campaign's current phase."""

    def __init__(self, news: CellNews, cell: str):
        self.news, self.cell = news, cell

    def stage(self, text: str) -> None:
        self.news.phase(self.cell, text)

    def point_start(self, label: str, total: Optional[int], duration_s: Optional[float]) -> None:
        self.news.phase(self.cell, f"point {label}")
