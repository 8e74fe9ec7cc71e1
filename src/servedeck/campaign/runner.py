"""`servedeck campaign run`: every cell launched through the deck, gated, measured, stopped; unattended.

Per cell: launch each replica (`deck.start` of its derived model entry) → gate (a run folder) → each
workload (a run folder, inheriting the gate of this launch) → stop. How a cell ends:
    done        every workload ran (a failed gate is recorded, and marks the figures, but is not a failure)
    failed      a replica did not boot (its run folder holds the engine log and the classified cause),
                or a server died mid-measurement; the campaign goes on with the next cell
    timed-out   cell_timeout passed: the cell's engines were stopped, what finished is kept
    pending     Ctrl-C: the cell's engines are stopped and `campaign run --resume` redoes it
Decisions (which cells, in what order, side by side or not) are cells.py's; this module carries them out.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Protocol

from servedeck.campaign import cells as C
from servedeck.campaign.bench import BenchSpec
from servedeck.campaign.file import Campaign, WorkloadCfg, parse
from servedeck.campaign.folder import CampaignFolder, campaigns_root, newest_unfinished
from servedeck.campaign.outputs import compare_runs
from servedeck.campaign.reporter import QuietReporter
from servedeck.campaign.session import Outcome, bench as bench_on_target, gate as gate_on_target
from servedeck.campaign.summary import render_markdown
from servedeck.campaign.target import Target, layout_facts
from servedeck.config import Config
from servedeck.deck import Deck
from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.deck import settings_of
from servedeck.errors import ConfigError, LaunchError, RefusedError, RunError, ServedeckError
from servedeck.gates.niah import GateSpec
from servedeck.hostcpu import usable_cpus
from servedeck.loadgen import ClosedLoop, OpenLoop
from servedeck.report.render import markdown
from servedeck.runs import inventory
from servedeck.runs.folder import RunFolder, runs_root
from servedeck.runs.read import load as load_run
from servedeck.supervisor import process as P
from servedeck.timeparse import seconds

LOCK_WAIT_S = 3600.0  # parallel cells queue for the deck lock while another one boots


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


@dataclass(frozen=True)
class RunOptions:
    resume: bool = False
    only: Optional[frozenset[str]] = None
    parallel: bool = False
    retry_failed: bool = False
    evict: bool = False


def bench_spec(w: WorkloadCfg) -> BenchSpec:
    """A [[workloads]] entry → what `servedeck bench` would run, with the same defaults."""
    if w.rate:
        shapes: tuple[Any, ...] = tuple(OpenLoop(r, w.arrivals) for r in w.rate)
    else:
        shapes = tuple(ClosedLoop(c) for c in (w.concurrency or [1]))
    duration_s = seconds(w.duration, "duration") if w.duration else None
    requests = w.requests
    if duration_s is None and requests is None:
        duration_s, requests = (60.0, None) if w.kind == "chat" else (None, 3)
    return BenchSpec(workload=w.kind, shapes=shapes, output_tokens=w.output_tokens or (1024 if w.kind == "chat" else 64),
                     input_tokens=w.input_tokens if w.kind == "chat" else None,
                     prompt_tokens=w.prompt_tokens if w.kind == "long-prompt" else None,
                     duration_s=duration_s, requests=requests, warmup=w.warmup, seed=w.seed,
                     client_procs=w.client_procs)


def check_host(camp: Campaign, cells: list[C.Cell]) -> None:
    """CPU sets must exist here (a typo would otherwise fail every boot of that variant)."""
    have = usable_cpus()
    bad = [f"variants.{c.variant}.cpus: CPU {sorted(c.cpus - have)} is not usable here (usable: "
           f"{','.join(str(x) for x in sorted(have))})" for c in cells if c.repeat == 1 and c.cpus - have]
    if bad:
        raise ConfigError("\n".join(f"{camp.path}: {b}" for b in bad), hint="pick CPUs this host has (`nproc`, lscpu)")


class Runner:
    checks_host = True  # the CPU sets must exist here (not so for a head dispatching to Ray nodes)

    def __init__(self, cfg: Config, camp: Campaign, opts: RunOptions, reporter: Optional[CampaignReporter] = None,
                 head_folder: Optional[str] = None):
        """`head_folder`: the name of a campaign folder another process keeps (a Ray node runs a cell of the
        head's campaign): the record is held in memory, and no campaign folder is written here."""
        self.user_cfg = cfg
        self.opts = opts
        self.rep = reporter or QuietCampaignReporter()
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
        if self.checks_host:
            check_host(camp, self.cells)
        if opts.only:
            unknown = sorted(opts.only - {v.name for v in camp.variants})
            if unknown:
                raise ConfigError(f"--only: no variant named {', '.join(unknown)} in {camp.path}",
                                  hint="variants: " + ", ".join(v.name for v in camp.variants))
        self.deck = Deck(self.derived.cfg)
        self.ours = {n for names in self.derived.models.values() for n in names}
        if head_folder is not None:
            self.folder = CampaignFolder.held_for(head_folder, camp, self.cells, self.derived.base)
        elif opts.resume:
            self.folder = CampaignFolder.open(found)
        else:
            self.folder = CampaignFolder.create(root, camp, self.cells, self.derived.base)
        self.runs_root = runs_root(cfg.deck.host.results_dir)
        self.durations: list[float] = []
        self.interrupted = threading.Event()
        self.expired: set[str] = set()
        # where cells run: this host; on a Ray node, also its node id (summary.json and campaign.json say it)
        self.node: dict[str, Any] = {"host": socket.gethostname()}

    # --- before anything starts ---------------------------------------------------------------
    def reap(self) -> list[str]:
        """Engines of this campaign left by a servedeck that is gone (SIGKILL): stop them, by process group."""
        running = self.deck.running()
        mine = [n for n in running if n in self.ours]
        owners = {running[n].owner_pid for n in mine}
        live_owner = [o for o in owners if o and o != os.getpid() and P.alive(o)]
        if live_owner:
            raise RefusedError(f"campaign {self.camp.name} is being run by servedeck pid {live_owner[0]} "
                               f"(its engines: {', '.join(mine)})",
                               hint="wait for it, or stop it (Ctrl-C in its terminal) before resuming")
        if mine:
            self.deck.stop(mine, wait_s=LOCK_WAIT_S)
            for n in mine:
                S.journal("campaign", n, "orphan-reaped", campaign=self.camp.name, folder=self.folder.path.name)
            self.rep.note(f"stopped {len(mine)} engine(s) left by an earlier run of this campaign: {', '.join(mine)}")
        return mine

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

    def _running(self) -> dict[str, dict[str, Any]]:
        return {n: r.to_json() for n, r in self.deck.running().items()}

    def check_holders(self, todo: list[C.Cell]) -> None:
        running = self._running()
        for cell in todo:
            held = C.holders_in_the_way(cell, running, self.ours)
            if held and not self.opts.evict:
                who = ", ".join(f"{h} (gpus {running[h].get('gpus')}, cpus {running[h].get('cpus')}, "
                                f"pid {running[h].get('pid')})" for h in held)
                raise RefusedError(f"cell {cell.id} needs GPUs {sorted(cell.gpus)} / CPUs {sorted(cell.cpus)}, "
                                   f"held by {who}", hint="stop it, or pass --evict to let the campaign stop it")

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> CampaignFolder:
        self.reap()
        todo = self.todo()
        self.check_holders(todo)
        self.folder.save()
        total = len(self.cells)
        self.rep.begin(self.folder.path, total, self._done_count())
        self._render()
        if not self.opts.parallel:
            for cell in todo:
                self.run_cell(cell)
            self._compare_outputs()
            self._render()
            return self.folder
        pending = list(todo)
        running: dict[Future[str], C.Cell] = {}
        pool = ThreadPoolExecutor(max_workers=max(1, len(todo)), thread_name_prefix="cell")
        try:
            while pending or running:
                for cell in C.next_cells(pending, running.values(), parallel=True):
                    pending.remove(cell)
                    running[pool.submit(self.run_cell, cell)] = cell
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for f in finished:
                    running.pop(f)
                    f.result()
        except KeyboardInterrupt:
            self.interrupted.set()
            for cell in running.values():
                self._kill(cell)
            wait(list(running))
            raise
        finally:
            pool.shutdown(wait=True)
            self._render()
        self._compare_outputs()
        self._render()
        return self.folder

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
        if not self.folder.written:
            return
        try:
            self.folder.write_markdown(render_markdown(self.folder.doc, self.runs_root))
        except Exception as e:  # campaign.json is the record; a rendering bug must not stop the campaign
            self.rep.note(f"campaign.md not written: {type(e).__name__}: {e}")

    def _kill(self, cell: C.Cell) -> None:
        """Stop a cell's engines from outside its thread (timeout, Ctrl-C): their group, then the deck settles."""
        for name in cell.models:
            rec = S.read_live(name)
            if rec and P.alive(rec.pid, rec.create_time):
                P.stop_group(rec.pgid, 10.0)

    def run_cell(self, cell: C.Cell) -> str:
        prior = self.folder.cell(cell.id)
        earlier = prior.get("earlier_runs", []) + prior.get("runs", [])
        self.folder.move_cell(cell.id, C.CellState.RUNNING, runs=[], earlier_runs=earlier, reason=None,
                              signature=None, started=S.now_iso(), ended=None, **self._node_fields())
        t0 = time.monotonic()
        timer = threading.Timer(self.camp.head.cell_timeout_s, self._expire, args=(cell,))
        timer.daemon = True
        timer.start()
        state, reason, signature = C.CellState.DONE, None, None
        try:
            state, reason, signature = self._cell_work(cell)
        except KeyboardInterrupt:
            state, reason = C.CellState.PENDING, "interrupted (Ctrl-C); `servedeck campaign run FILE --resume` redoes this cell"
            raise
        except ServedeckError as e:
            state, reason = C.CellState.FAILED, e.message
        except Exception as e:  # a servedeck bug in one cell must not lose the others
            state, reason = C.CellState.FAILED, f"servedeck failed: {type(e).__name__}: {e}"
        finally:
            timer.cancel()
            if self.interrupted.is_set() and state != C.CellState.DONE:
                state, reason = C.CellState.PENDING, "interrupted (Ctrl-C); `servedeck campaign run FILE --resume` redoes this cell"
            elif cell.id in self.expired and state != C.CellState.DONE:
                state = C.CellState.TIMED_OUT
                reason = f"cell_timeout {self.camp.head.cell_timeout} passed; engines stopped" + \
                    (f" ({reason})" if reason else "")
            self._stop(cell)
            self.folder.move_cell(cell.id, state, reason=reason, signature=signature, ended=S.now_iso())
            if state.finished:
                self.durations.append(time.monotonic() - t0)
            done = self._done_count()
            remaining = sum(not C.CellState(c["state"]).finished for c in self.folder.doc["cells"])
            self.rep.cell_end(cell.id, state.value, reason, done, len(self.cells),
                              C.eta_s(self.durations, remaining))
            self._render()
        return state.value

    def _node_fields(self) -> dict[str, Any]:
        return {"node": self.node["host"], **({"ray_node_id": self.node["ray_node_id"]}
                                               if self.node.get("ray_node_id") else {})}

    def _expire(self, cell: C.Cell) -> None:
        self.expired.add(cell.id)
        self.rep.note(f"{cell.id}: cell_timeout {self.camp.head.cell_timeout} passed; stopping its engines")
        self._kill(cell)

    def _stop(self, cell: C.Cell) -> None:
        try:  # the deck's stop also drops them from desired state: `restore` never brings a cell back
            self.deck.stop(list(cell.models), wait_s=LOCK_WAIT_S)
        except ServedeckError as e:
            self.rep.note(f"{cell.id}: stopping its engines: {e.message}")

    def _extra(self, cell: C.Cell) -> dict[str, Any]:
        ms = [self.derived.cfg.models[n] for n in cell.models]
        return {"campaign": {"name": self.camp.name, "folder": self.folder.path.name, "variant": cell.variant,
                             "repeat": cell.repeat, "cell": cell.id},
                **layout_facts(ms), "node": dict(self.node)}

    def _cell_work(self, cell: C.Cell) -> tuple[C.CellState, Optional[str], Optional[str]]:
        head = self.camp.head
        held = C.holders_in_the_way(cell, self._running(), self.ours) if self.opts.evict else []
        if held:
            self.rep.phase(cell.id, f"evicting {', '.join(held)}")
        targets: list[Target] = []
        extra = self._extra(cell)
        for i, name in enumerate(cell.models):
            self.rep.phase(cell.id, f"launching {name}" + (f" (replica {i + 1}/{len(cell.models)})"
                                                          if len(cell.models) > 1 else ""))
            try:
                rec = self.deck.start(name, wait_s=LOCK_WAIT_S, reason=f"campaign {self.camp.name}",
                                      evict=held if i == 0 else ()).record
            except LaunchError as e:
                run = self._failed_launch(cell, name, e, extra)
                self.folder.add_run(cell.id, run)
                return C.CellState.FAILED, e.message, (e.cause or {}).get("signature") or (e.cause or {}).get("id")
            targets.append(Target(name, self.derived.cfg, rec, launched=True, run_model=self.derived.base,
                                  run_layout=cell.variant, extra=extra))
            if self.interrupted.is_set() or cell.id in self.expired:
                return C.CellState.FAILED, "stopped while launching", None
        main = targets[0]
        main.peers = targets[1:]
        gate_ctx = head.gate.context if head.gate else 0
        if head.gate:  # on every replica: each is a launch of its own (the workloads cite the first's)
            for i, t in enumerate(targets):
                self.rep.phase(cell.id, "gate" + (f" (replica {i + 1})" if len(targets) > 1 else ""))
                out = _Listed(lambda run: self.folder.add_run(cell.id, run))
                try:
                    spec = GateSpec(context=head.gate.context, depths=tuple(head.gate.depths),
                                    repeats=head.gate.repeats, threshold=head.gate.threshold, seed=head.gate.seed)
                    asyncio.run(gate_on_target(t, spec, reporter=_PhaseReporter(self.rep, cell.id), outcome=out))
                finally:
                    if out.folder is not None:
                        self.folder.add_run(cell.id, out.folder.name)
        for k, w in enumerate(self.camp.file.workloads):
            self.rep.phase(cell.id, f"workload {w.title}")
            out = _Listed(lambda run: self.folder.add_run(cell.id, run))
            spec = bench_spec(w)
            if head.reference and k == 0:  # the fixed greedy prompts, compared with the reference variant's
                spec = replace(spec, check_outputs=True, check_prompts=head.reference_prompts,
                               check_tokens=head.reference_tokens)
            try:
                asyncio.run(bench_on_target(main, spec, gate_mode=None if head.gate else False,
                                            gate_spec=GateSpec(context=gate_ctx),
                                            reporter=_PhaseReporter(self.rep, cell.id), outcome=out))
            finally:
                if out.folder is not None:
                    self.folder.add_run(cell.id, out.folder.name)
        return C.CellState.DONE, None, None

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

    def __init__(self, rep: CampaignReporter, cell: str):
        self.rep, self.cell = rep, cell

    def stage(self, text: str) -> None:
        self.rep.phase(self.cell, text)

    def point_start(self, label: str, total: Optional[int], duration_s: Optional[float]) -> None:
        self.rep.phase(self.cell, f"point {label}")


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
    inv = inv if inv is not None else nvml_inventory()
    deck = Deck(derived.cfg)
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
                            "fit": fits}
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
            "host_problem": host_problem,
            "cells": [{"id": c.id, "variant": c.variant, "repeat": c.repeat, "models": list(c.models),
                       "gpus": sorted(c.gpus), "cpus": sorted(c.cpus)} for c in cells],
            "variants": variants,
            "workloads": [dict(w.model_dump(exclude_none=True), points=bench_spec(w).to_json()["points"])
                          for w in camp.file.workloads]}
