"""A cell's steps, wherever it runs: launch each replica through the deck → gate (a run folder per
replica) → each workload (a run folder, inheriting the gate of this launch) → the engines stopped.

The runner (runner.py) decides when a cell runs and records how it ends; a placement decides where
(this process's threads, or a Ray node). Both call these steps and neither repeats them. A workload of any
kind is its kind's (workloads/kinds.py: the entry's specs, run by workloads/session.py), so a new workload kind,
gate kind or per-point sampler changes neither this module nor a placement. The steps report through
`CellNews`, the same on a Ray node as on this host. A cell stopped before all its workloads ran (its
cell_timeout, Ctrl-C) says which never started.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from servedeck.campaign import cells as C
from servedeck.campaign.accuracy import campaign_gates
from servedeck.campaign.file import Campaign
from servedeck.deck import Deck
from servedeck.deck import launch as L
from servedeck.deck.deck import settings_of
from servedeck.errors import LaunchError, ServedeckError
from servedeck.gates.niah import GateSpec
from servedeck.report.render import markdown
from servedeck.runs import inventory
from servedeck.runs.folder import RunFolder
from servedeck.runs.read import load as load_run
from servedeck.workloads import outputs
from servedeck.workloads.kinds import KINDS
from servedeck.workloads.reporter import QuietReporter
from servedeck.workloads.session import Outcome, gate_run, run as run_on_target
from servedeck.workloads.shape import Entry
from servedeck.workloads.target import Target, layout_facts

LOCK_WAIT_S = 3600.0  # parallel cells queue for the deck lock while another one boots


class CellNews(Protocol):
    """What a cell's work tells the runner that keeps the campaign's record: the same four calls from a
    thread here as from a Ray node (the head replays each node's stream onto them)."""

    def phase(self, cell: str, text: str) -> None: ...  # what the cell does now
    def note(self, text: str) -> None: ...  # something the user should read
    def run_made(self, cell: str, run: str) -> None: ...  # a run folder of this cell exists (its name here)
    def placed(self, cell: str, **fields: Any) -> None: ...  # where it runs: node, ray_node_id, node_gpus, attempts


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
            if stopping():  # the cell's cut-off (cell_timeout) or Ctrl-C came between two workloads
                return self._cut_short(k, None)
            news.phase(cell.id, f"workload {w.title}")
            specs = KINDS[w.kind].from_entry(w, self._where(k))
            made: list[_Listed] = []
            try:
                for spec in specs:  # a run folder each (a capacity search: one per SLO it names)
                    if len(specs) > 1:
                        news.phase(cell.id, f"workload {w.title}: {getattr(spec, 'label', spec.kind)}")
                    made.append(_one_run(cell, news, lambda out, spec=spec: run_on_target(
                        main, spec, gate_mode=None if needle else False, gate_spec=GateSpec(context=gate_ctx),
                        reporter=_PhaseReporter(news, cell.id), outcome=out)))
            except Exception as e:
                if not stopping():
                    raise
                return self._cut_short(k + 1, e)  # stopped under this workload: its folder says how it ended
            unlike = self._unlike_reference_run(cell, news, made) if k == 0 else None
            if unlike is not None:
                return unlike
        return C.Ending(C.CellState.DONE)

    def _unlike_reference_run(self, cell: C.Cell, news: CellNews, made: list["_Listed"]) -> Optional[C.Ending]:
        """campaign.reference_run: the launch's output check (the first workload's run) held against that run's the
        moment it is answered. Outputs that differ (the variant not outputs_may_differ) end the cell here, failed,
        naming the first difference and the workloads never started; else None, and the cell goes on. A reference
        this node cannot read (a Ray node with results of its own) is said, and the cell goes on: the campaign's
        owner compares them afterwards (the tune does)."""
        ref_name = self.camp.head.reference_run
        if ref_name is None or self.camp.variant(cell.variant).outputs_may_differ:
            return None
        run = next((m.folder for m in made if m.folder is not None and (m.folder / outputs.FILE).exists()), None)
        if run is None:
            return None
        ref = self.runs_root / ref_name  # a path given whole stays itself (pathlib joins onto an absolute one so)
        try:
            got = outputs.compare_runs(ref, run)
        except ServedeckError as e:
            news.note(f"{cell.id}: its output check was not held against {ref_name} here ({e.message}); "
                      "its workloads go on")
            return None
        if got["verdict"] != "differs":
            return None
        first = next(r for r in got["rows"] if r["verdict"] == "differs")
        left = self._titles_from(1)
        why = (f"greedy outputs differ from {ref.name}'s (campaign.reference_run): {got['identical']}/{got['prompts']}"
               f" prompts identical, the first difference at prompt {first.get('index')}, "
               f"{first.get('unit') or 'token'} {first.get('position')}; not measured further")
        return C.Ending(C.CellState.FAILED, why + (f" (never started: {', '.join(left)})" if left else ""),
                        fields={"not_started": left, "stopped_by": "reference_run"})

    def _cut_short(self, k: int, err: Optional[BaseException]) -> C.Ending:
        """The cell was stopped with workloads k… not started: the ending names them (campaign.json keeps them
        as `not_started`), after how the one running ended, if one was."""
        left = self._titles_from(k)
        why = getattr(err, "message", None) or (f"{type(err).__name__}: {err}" if err is not None else "")
        never = f"never started: {', '.join(left)}" if left else ""
        return C.Ending(C.CellState.FAILED, "; ".join(x for x in (why, never) if x) or "stopped",
                        fields={"not_started": left})

    def _titles_from(self, k: int) -> list[str]:
        """The titles of the campaign's workloads k… (those a cell stopped early never started)."""
        return [w.title for w in self.camp.file.workloads[k:]]

    def _where(self, k: int) -> Entry:
        """Where workload k of the campaign file is read; the first one answers the output check when the
        campaign names a `reference` variant."""
        head = self.camp.head
        return Entry(base=Path(self.camp.path).parent, slos=self.camp.slos,
                     output_check=(head.reference_prompts, head.reference_tokens) if head.reference and k == 0
                     else None)

    def kill(self, cell: C.Cell, reason: str) -> None:
        """Stop a cell's engines from outside its thread (timeout, Ctrl-C): their group now, marked as a
        stop (not a crash); the deck settles their records at the cell's own stop, under its lock."""
        self.deck.kill(cell.models, reason=reason)

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
