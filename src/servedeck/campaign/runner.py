"""`servedeck campaign run`: every cell launched through the deck, gated, measured, stopped; unattended.

The runner owns every cell's state (cells.CellState, moved only through CampaignFolder.move_cell) and
the one way a cell ends, wherever it ran:
    done        every workload ran (a failed gate is recorded, and marks the figures, but is not a failure)
    failed      a replica did not boot (its run folder holds the engine log and the classified cause),
                or a server died mid-measurement, or its Ray node was lost; the campaign goes on
    timed-out   cell_timeout passed: the cell's engines were stopped, what finished is kept
    pending     Ctrl-C: the cell's engines are stopped and `campaign run --resume` redoes it
Where cells run is a placement passed in: `LocalPlacement` (this host, one cell at a time or side by
side on threads) or cluster.dispatch's `RayPlacement` (a Ray task per cell). On a host, a cell's work is
a `CellHere`: steps.py's steps (launch, gate, workloads, stop) under its cell_timeout. Its news reaches
the runner through `CellNews`, from a thread here as from a Ray node (which runs the same CellHere). Decisions (which cells, in what order, side by side or not) are cells.py's.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Protocol

from servedeck.campaign import cells as C
from servedeck.campaign.file import Campaign, parse
from servedeck.campaign.folder import CampaignFolder, campaigns_root, newest_unfinished
from servedeck.campaign.steps import LOCK_WAIT_S, CellNews, CellSteps
from servedeck.campaign.summary import render_markdown
from servedeck.config import Config
from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.errors import ConfigError, RefusedError, RunError, ServedeckError
from servedeck.hostcpu import usable_cpus
from servedeck.runs.folder import runs_root
from servedeck.supervisor import process as P
from servedeck.workloads.kinds import KINDS
from servedeck.workloads.outputs import compare_runs
from servedeck.workloads.shape import Entry

__all__ = ["CampaignReporter", "CellNews", "LocalPlacement", "Placement", "RunOptions", "Runner", "plan_campaign",
           "run_campaign"]


class CampaignReporter(Protocol):
    def begin(self, folder: Path, total: int, done: int) -> None: ...
    def phase(self, cell: str, text: str) -> None: ...
    def cell_end(self, cell: str, state: str, reason: Optional[str], done: int, total: int,
                 eta_s: Optional[float]) -> None: ...
    def note(self, text: str) -> None: ...


class QuietCampaignReporter:
    def begin(self, folder: Path, total: int, done: int) -> None:
        pass

    def phase(self, cell: str, text: str) -> None:
        pass

    def cell_end(self, cell: str, state: str, reason: Optional[str], done: int, total: int,
                 eta_s: Optional[float]) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class Placement:
    """Where cells run. What a placement must do: start a cell somewhere and report its news while it runs
    (`run`, through the CellNews it is handed, ending with how its work ended), and stop running cells on
    Ctrl-C (`stop`). It never moves a cell's state: the runner records. The rest has defaults: one cell at a
    time, no checks of its own, every cell the runner has to do."""

    resume_hint = "servedeck campaign run FILE --resume"  # the command that redoes an interrupted cell
    parallel = False  # cells may run side by side (each on a thread of this process; `start_now` picks them)
    cancel_wait_s: Optional[float] = None  # after Ctrl-C, how long to wait for running cells (None: until they end)

    def check(self, camp: Campaign, cells: list[C.Cell]) -> None:
        """Before a campaign folder exists: refuse what cannot run anywhere this placement puts cells."""

    def prepare(self, runner: "Runner") -> list[C.Cell]:
        """Once the campaign folder exists, before any cell starts: the runner it places cells for; the cells
        to do now."""
        self.runner = runner
        return runner.todo()

    def start_now(self, pending: list[C.Cell], running: list[C.Cell]) -> list[C.Cell]:
        return list(pending)

    def run(self, cell: C.Cell, news: CellNews) -> C.Ending:
        """The cell's work, wherever it runs; its news (phases, notes, run folders, where) reported on `news`."""
        raise NotImplementedError

    def stop(self, cells: list[C.Cell]) -> None:
        """Ctrl-C: stop these running cells' engines, wherever they run."""
        raise NotImplementedError

    def lanes(self) -> int:
        """How many cells run at once now (the ETA divides by it)."""
        return 1


@dataclass(frozen=True)
class RunOptions:
    resume: bool = False
    only: Optional[frozenset[str]] = None
    parallel: bool = False
    retry_failed: bool = False
    evict: bool = False


def check_host(camp: Campaign, cells: list[C.Cell]) -> None:
    """CPU sets must exist here (a typo would otherwise fail every boot of that variant)."""
    have = usable_cpus()
    bad = [f"variants.{c.variant}.cpus: CPU {sorted(c.cpus - have)} is not usable here (usable: "
           f"{','.join(str(x) for x in sorted(have))})" for c in cells if c.repeat == 1 and c.cpus - have]
    if bad:
        raise ConfigError("\n".join(f"{camp.path}: {b}" for b in bad), hint="pick CPUs this host has (`nproc`, lscpu)")


class Runner:
    """The one owner of a campaign's cells: which run, their states, how each ends; `place` says where."""

    def __init__(self, cfg: Config, camp: Campaign, opts: RunOptions, reporter: Optional[CampaignReporter] = None,
                 place: Optional[Placement] = None):
        self.user_cfg = cfg
        self.opts = opts
        self.rep = reporter or QuietCampaignReporter()
        self.place: Placement = place or LocalPlacement()
        root = campaigns_root(cfg.deck.host.results_dir)
        if opts.resume:
            found = newest_unfinished(root, camp)
            if found is None:
                raise RunError(f"no unfinished campaign {camp.name!r} from {camp.path} under {root}",
                               hint="start it anew without --resume")
            # a resume runs the campaign as it was frozen when it began, whatever the file says now
            camp = parse((found / "campaign.toml").read_text(), camp.path)
        self.camp = camp
        self.derived = C.derive(cfg, camp)
        self.cells = C.cell_list(camp, self.derived)
        self.place.check(camp, self.cells)
        if opts.only:
            unknown = sorted(opts.only - {v.name for v in camp.variants})
            if unknown:
                raise ConfigError(f"--only: no variant named {', '.join(unknown)} in {camp.path}",
                                  hint="variants: " + ", ".join(v.name for v in camp.variants))
        if opts.resume:
            self.folder = CampaignFolder.open(found)
        else:
            self.folder = CampaignFolder.create(root, camp, self.cells, self.derived.base)
        self.runs_root = runs_root(cfg.deck.host.results_dir)
        self.durations: list[float] = []
        self.interrupted = threading.Event()

    def todo(self) -> list[C.Cell]:
        out = []
        for cell in self.cells:
            rec = self.folder.cell(cell.id)
            if C.to_run(rec["state"], cell.variant, set(self.opts.only) if self.opts.only else None,
                        self.opts.retry_failed):
                out.append(cell)
            elif self.opts.only and cell.variant not in self.opts.only and rec["state"] == C.CellState.PENDING.value:
                self.folder.move_cell(cell.id, C.CellState.SKIPPED, reason="left out by --only")
        return out

    # --- CellNews: what a cell's work reports, from a thread here or from a node ---------------------
    def phase(self, cell: str, text: str) -> None:
        self.rep.phase(cell, text)

    def note(self, text: str) -> None:
        self.rep.note(text)

    def run_made(self, cell: str, run: str) -> None:
        self.folder.add_run(cell, run)

    def placed(self, cell: str, **fields: Any) -> None:
        self.folder.set_cell(cell, **fields)

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> CampaignFolder:
        todo = self.place.prepare(self)
        self.folder.save()
        self.rep.begin(self.folder.path, len(self.cells), self._done_count())
        self._render()
        try:
            if self.place.parallel:
                self._side_by_side(todo)
            else:
                for cell in todo:
                    self.run_cell(cell)
        finally:
            self._render()
        self._compare_outputs()
        self._render()
        return self.folder

    def _side_by_side(self, todo: list[C.Cell]) -> None:
        pending = list(todo)
        running: dict[Future[str], C.Cell] = {}
        pool = ThreadPoolExecutor(max_workers=max(1, len(todo)), thread_name_prefix="cell")
        try:
            while pending or running:
                for cell in self.place.start_now(pending, list(running.values())):
                    pending.remove(cell)
                    running[pool.submit(self.run_cell, cell)] = cell
                # short waits: the main thread must see Ctrl-C
                finished, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                for f in finished:
                    running.pop(f)
                    f.result()
        except KeyboardInterrupt:
            self.interrupt(list(running.values()))
            wait(list(running), timeout=self.place.cancel_wait_s)
            raise
        finally:
            pool.shutdown(wait=self.place.cancel_wait_s is None, cancel_futures=True)

    def interrupt(self, cells: list[C.Cell]) -> None:
        """Ctrl-C: every running cell ends pending, its engines stopped where they run."""
        self.interrupted.set()
        self.place.stop(cells)

    # --- one cell, from its start to its recorded end ----------------------------------------------
    def run_cell(self, cell: C.Cell) -> str:
        prior = self.folder.cell(cell.id)
        earlier = prior.get("earlier_runs", []) + prior.get("runs", [])
        self.folder.move_cell(cell.id, C.CellState.RUNNING, runs=[], earlier_runs=earlier, reason=None,
                              signature=None, started=S.now_iso(), ended=None, not_started=None)
        t0 = time.monotonic()
        ending = C.Ending(C.CellState.DONE)
        try:
            ending = self.place.run(cell, self)
        except KeyboardInterrupt:
            ending = C.Ending(C.CellState.PENDING, self._interrupted_reason())
            raise
        except Exception as e:
            ending = C.failed_by(e)
        finally:
            state = self._end(cell, ending, t0)
        return state.value

    def _interrupted_reason(self) -> str:
        return f"interrupted (Ctrl-C); `{self.place.resume_hint}` redoes this cell"

    def _end(self, cell: C.Cell, ending: C.Ending, t0: float) -> C.CellState:
        """How every cell ends, once its work has (its engines settled where it ran, a passed cell_timeout
        made timed-out there: CellHere): Ctrl-C makes it pending unless its work was done, then the record
        moves, progress and campaign.md follow."""
        state, reason = ending.state, ending.reason
        if self.interrupted.is_set() and state != C.CellState.DONE:
            state, reason = C.CellState.PENDING, self._interrupted_reason()
        self.folder.move_cell(cell.id, state, reason=reason, signature=ending.signature, ended=S.now_iso(),
                              **ending.fields)
        if state.finished:
            self.durations.append(time.monotonic() - t0)
        remaining = sum(not C.CellState(c["state"]).finished for c in self.folder.doc["cells"])
        self.rep.cell_end(cell.id, state.value, reason, self._done_count(), len(self.cells),
                          C.eta_s(self.durations, remaining, self.place.lanes()))
        self._render()
        return state

    # --- after the cells ------------------------------------------------------------------------
    def _compare_outputs(self) -> None:
        """`reference = "VARIANT"`: each done cell's greedy outputs against the reference variant's first done
        cell, token by token (identical, or the first diverging position and both continuations)."""
        ref = self.camp.head.reference
        if not ref:
            return
        def outputs_run(c: dict[str, Any]) -> Optional[Path]:
            return next((self.runs_root / r for r in c.get("runs") or []
                         if (self.runs_root / r / "outputs.jsonl").exists()), None)
        done = [c for c in self.folder.doc["cells"] if c["state"] == C.CellState.DONE.value]
        base = next((outputs_run(c) for c in done if c["variant"] == ref and outputs_run(c)), None)
        result: dict[str, Any] = {"reference": ref, "cells": {}}
        if base is None:
            result["note"] = f"no done cell of the reference variant {ref!r} answered the output check"
        else:
            for c in done:
                run = outputs_run(c)
                if run is not None and run != base:
                    cmp = compare_runs(base, run)
                    result["cells"][c["id"]] = {k: cmp[k] for k in ("a", "b", "verdict", "prompts", "identical")} | {
                        "first_difference": next((r for r in cmp["rows"] if r["verdict"] != "identical"), None)}
        self.folder.doc["outputs_vs_reference"] = result
        self.folder.save()

    def _done_count(self) -> int:
        return sum(C.CellState(c["state"]).finished for c in self.folder.doc["cells"])

    def _render(self) -> None:
        try:
            self.folder.write_markdown(render_markdown(self.folder.doc, self.runs_root))
        except Exception as e:  # campaign.json is the record; a rendering bug must not stop the campaign
            self.rep.note(f"campaign.md not written: {type(e).__name__}: {e}")


class CellHere:
    """One cell's work on this host, the same in `campaign run` here as on a Ray node: its steps under its
    cell_timeout, then its engines stopped through the deck. It returns how the work ended (a passed
    cell_timeout makes it timed-out, unless the work was done) and records nothing: the news goes to
    `news`, the ending to whoever keeps the campaign's record."""

    def __init__(self, steps: CellSteps, cell: C.Cell, camp: Campaign):
        self.steps, self.cell, self.camp = steps, cell, camp
        self.stopped = threading.Event()  # Ctrl-C: the work ends at its next step
        self.expired = threading.Event()  # cell_timeout passed

    def run(self, news: CellNews) -> C.Ending:
        cell = self.cell
        timer = threading.Timer(self.camp.head.cell_timeout_s, self._expire, args=(news,))
        timer.daemon = True
        timer.start()
        try:
            try:
                ending = self.steps.run(cell, news, lambda: self.stopped.is_set() or self.expired.is_set())
            except Exception as e:  # KeyboardInterrupt goes on up: the runner makes the cell pending
                ending = C.failed_by(e)
        finally:
            timer.cancel()
            self.steps.stop(cell, news)
        if self.expired.is_set() and ending.state != C.CellState.DONE:
            ending = C.Ending(C.CellState.TIMED_OUT,
                              f"cell_timeout {self.camp.head.cell_timeout} passed; engines stopped"
                              + (f" ({ending.reason})" if ending.reason else ""), ending.signature, ending.fields)
        return ending

    def _expire(self, news: CellNews) -> None:
        self.expired.set()
        news.note(f"{self.cell.id}: cell_timeout {self.camp.head.cell_timeout} passed; stopping its engines")
        self.steps.kill(self.cell, f"campaign {self.camp.name}: cell_timeout {self.camp.head.cell_timeout} passed")

    def stop(self) -> None:
        """From outside the cell's thread (Ctrl-C): its engines stopped by process group, its work ends."""
        self.stopped.set()
        self.steps.kill(self.cell, f"campaign {self.camp.name}: interrupted (Ctrl-C)")


class LocalPlacement(Placement):
    """Cells on this host: one at a time, or (--parallel) side by side when their GPU/CPU sets are
    disjoint, each on a thread; each cell is a CellHere in this process."""

    def __init__(self) -> None:
        self.node = {"host": socket.gethostname()}  # where cells run (summary.json and campaign.json say it)
        self.here: dict[str, CellHere] = {}  # running cells
        self.here_lock = threading.Lock()
        self.stopping = False

    def check(self, camp: Campaign, cells: list[C.Cell]) -> None:
        check_host(camp, cells)

    def prepare(self, runner: Runner) -> list[C.Cell]:
        self.runner = runner
        self.parallel = runner.opts.parallel
        self.steps = CellSteps(runner.derived, runner.camp, runner.runs_root, runner.folder.path.name, self.node,
                               evict=runner.opts.evict)
        self.reap()
        todo = runner.todo()
        self.check_holders(todo)
        return todo

    def reap(self) -> list[str]:
        """Engines of this campaign left by a servedeck that is gone (SIGKILL): stop them, by process group."""
        r, deck = self.runner, self.steps.deck
        running = deck.running()
        mine = [n for n in running if n in self.steps.ours]
        owners = {running[n].owner_pid for n in mine}
        live_owner = [o for o in owners if o and o != os.getpid() and P.alive(o)]
        if live_owner:
            raise RefusedError(f"campaign {r.camp.name} is being run by servedeck pid {live_owner[0]} "
                               f"(its engines: {', '.join(mine)})",
                               hint="wait for it, or stop it (Ctrl-C in its terminal) before resuming")
        if mine:
            deck.stop(mine, wait_s=LOCK_WAIT_S)
            for n in mine:
                S.journal("campaign", n, "orphan-reaped", campaign=r.camp.name, folder=r.folder.path.name)
            r.note(f"stopped {len(mine)} engine(s) left by an earlier run of this campaign: {', '.join(mine)}")
        return mine

    def check_holders(self, todo: list[C.Cell]) -> None:
        running = self.steps.running()
        for cell in todo:
            held = C.holders_in_the_way(cell, running, self.steps.ours)
            if held and not self.runner.opts.evict:
                who = ", ".join(f"{h} (gpus {running[h].get('gpus')}, cpus {running[h].get('cpus')}, "
                                f"pid {running[h].get('pid')})" for h in held)
                raise RefusedError(f"cell {cell.id} needs GPUs {sorted(cell.gpus)} / CPUs {sorted(cell.cpus)}, "
                                   f"held by {who}", hint="stop it, or pass --evict to let the campaign stop it")

    def start_now(self, pending: list[C.Cell], running: list[C.Cell]) -> list[C.Cell]:
        return C.next_cells(pending, running, parallel=self.parallel)

    def run(self, cell: C.Cell, news: CellNews) -> C.Ending:
        news.placed(cell.id, node=self.node["host"])
        here = CellHere(self.steps, cell, self.runner.camp)
        with self.here_lock:
            self.here[cell.id] = here
            if self.stopping:  # Ctrl-C came as this cell's thread began
                here.stopped.set()
        try:
            return here.run(news)
        finally:
            with self.here_lock:
                self.here.pop(cell.id, None)

    def stop(self, cells: list[C.Cell]) -> None:
        with self.here_lock:
            self.stopping = True
            here = [self.here[c.id] for c in cells if c.id in self.here]
        for h in here:
            h.stop()


def run_campaign(cfg: Config, camp: Campaign, opts: RunOptions,
                 reporter: Optional[CampaignReporter] = None) -> CampaignFolder:
    return Runner(cfg, camp, opts, reporter).run()


# --- plan ---------------------------------------------------------------------------------------

def plan_campaign(cfg: Config, camp: Campaign, inv: Any = None) -> dict[str, Any]:
    """What `campaign run` would do, rendered now; nothing starts. `inv`: an NVML inventory to plan
    against (default: this host's, now)."""
    from servedeck.gpu import fit_now, inventory as nvml_inventory, plan_model

    derived = C.derive(cfg, camp)
    cells = C.cell_list(camp, derived)
    planned_elsewhere = inv is not None
    inv = inv if inv is not None else nvml_inventory()
    plan_cfg, numa_notes = on_topology(derived.cfg, inv.numa) if planned_elsewhere and inv.numa else (derived.cfg, [])
    deck = Deck(plan_cfg)
    variants = {}
    for v in camp.variants:
        reps = []
        for name in derived.models[v.name]:
            m = derived.cfg.models[name]
            spec = deck.render(name)
            try:
                plan, _ = plan_model(derived.cfg, name, inv)
                mem: Any = plan.to_json()
            except (ServedeckError, ValueError, OSError) as e:
                mem = {"error": getattr(e, "message", str(e))}
            fit = fit_now(derived.cfg, name, inv=inv)
            reps.append({"model": name, "engine": spec.engine, "port": spec.port, "argv": spec.redacted_argv(),
                         "env": spec.redacted_env(), "gpus": list(m.gpus), "cpus": list(m.cpus),
                         "tp": m.tp, "dp": m.dp, "pp": m.pp, "memory_plan": mem, "fit": fit.to_json()})
        verdicts = [r["fit"]["status"] for r in reps]
        fits = "no-room" if "no-room" in verdicts else "unknown" if "unknown" in verdicts else "fits"
        variants[v.name] = {"overrides": v.overrides(), "knobs": camp.knobs.get(v.name, {}), "replicas": reps,
                            "fit": fits, "outputs_may_differ": v.outputs_may_differ}
    try:
        check_host(camp, cells)
        host_problem = None
    except ConfigError as e:
        host_problem = e.message
    gate = camp.head.gate
    return {"name": camp.name, "file": str(camp.path), "model": derived.base,
            "cell_timeout": camp.head.cell_timeout, "repeats": camp.head.repeats,
            "gate": gate.model_dump() if gate else None, "base_variant": camp.base_variant,
            "reference": camp.head.reference,
            "inventory": {"available": inv.available, "reason": inv.reason,
                          "gpus": [{"index": g.index, "name": g.name} for g in inv.gpus]},
            "host_problem": host_problem, "numa": numa_notes,
            "cells": [{"id": c.id, "variant": c.variant, "repeat": c.repeat, "models": list(c.models),
                       "gpus": sorted(c.gpus), "cpus": sorted(c.cpus)} for c in cells],
            "variants": variants,
            "workloads": [dict(w.model_dump(exclude_none=True),  # a capacity search picks its own points
                               points=_points(w, camp))
                          for w in camp.file.workloads]}


def on_topology(cfg: Config, numa: dict[int, list[int]]) -> tuple[Config, list[str]]:
    """`cfg` as it would render on a host whose NUMA nodes are `numa` (an inventory's): every container
    with CPUs and no memory nodes of its own gets the nodes of those CPUs there, not here. Second: a
    sentence per model whose CPUs that host does not have."""
    from servedeck.hostcpu import nodes_of

    models, notes = {}, []
    for name, m in cfg.models.items():
        build = cfg.deck.builds.get(m.build)
        if not (m.cpus and not m.cpu_mems and build is not None and build.image):
            models[name] = m
            continue
        known = {c for cs in numa.values() for c in cs}
        missing = sorted(set(m.cpus) - known)
        if missing:
            notes.append(f"{name}: CPUs {missing} are on no NUMA node of the inventory's host")
        models[name] = m.model_copy(update={"cpu_mems": nodes_of(list(m.cpus), numa)})
    return replace(cfg, deck=cfg.deck.model_copy(update={"models": models})), notes


def _points(w: Any, camp: Campaign) -> list[str]:
    """A workload's points as the plan lists them, from its kind's specs (a capacity search picks its own: none
    listed; a conversations workload is one point of all its users)."""
    where = Entry(base=Path(camp.path).parent, slos=camp.slos, read_files=False)
    return [p for spec in KINDS[w.kind].from_entry(w, where) for p in spec.to_json()["points"]]
