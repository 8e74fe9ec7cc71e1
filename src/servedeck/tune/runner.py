"""`servedeck tune FILE`: the starter, then trials chosen by Optuna's TPE until the budget is spent, one at a time.

Each trial is a one-variant campaign (tune/file.py) run by the campaign's own Runner (launch through the deck,
gate, output check, capacity search under the SLO, engines stopped by process group), after two checks that
keep a variant from ever booting: the `require` rules and the planner's fit (gpu/fit.py, as `campaign plan`
reads it). Its verdict (objective.py) is told to the study, kept in SQLite under the tune folder, so a resume
continues the same search: a trial Ctrl-C or a crash cut short is told failed and its values asked again (the
same values, a new trial); finished trials are never redone.

`tune FILE --ray ADDRESS`: every trial's campaign is run with the campaign's RayPlacement (a Ray task on a node),
and up to `parallel` searched trials run at once, each on a thread of this head process; the study is asked and
told only from the main thread (ask several, tell each as it ends). The starter still runs first, alone; the
verification runs its launches one at a time (RayPlacement, one cell at a time). Trials side by side take
ports `lane` apart (campaign.port_offset), so two on one host never collide.
"""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Optional, Protocol

from filelock import FileLock, Timeout

from servedeck.campaign import cells as C
from servedeck.campaign.folder import CampaignFolder, campaigns_root
from servedeck.campaign.runner import Placement, RunOptions, Runner
from servedeck.campaign.summary import capacity_of
from servedeck.report.capacity import capacity_rows
from servedeck.report.recommend import outputs_of
from servedeck.runs.read import load as load_run
from servedeck.config import Config
from servedeck.deck import Deck
from servedeck.deck.state import now_iso
from servedeck.engines import get_engine
from servedeck.errors import ConfigError, RefusedError, RunError, ServedeckError, UsageError
from servedeck.runs.folder import runs_root
from servedeck.supervisor import process as P
from servedeck.tune import objective as O
from servedeck.tune import storage as S
from servedeck.tune.importance import of_study
from servedeck.tune import verify as V
from servedeck.tune.file import STARTER, Tune, parse
from servedeck.tune.space import IntRange, Together, known_values
from servedeck.tune.folder import DONE, INTERRUPTED, RUNNING, TuneFolder, newest_unfinished, tunes_root
from servedeck.workloads.outputs import compare_runs


class TuneReporter(Protocol):
    def begin(self, folder: Path, done: int, budget: Optional[int]) -> None: ...
    def trial_start(self, trial: str, values: dict[str, Any]) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_end(self, trial: str, rec: dict[str, Any], best: str) -> None: ...
    def note(self, text: str) -> None: ...


class QuietTuneReporter:
    def begin(self, folder: Path, done: int, budget: Optional[int]) -> None:
        pass

    def trial_start(self, trial: str, values: dict[str, Any]) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def trial_end(self, trial: str, rec: dict[str, Any], best: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class _CellNews:
    """The campaign runner's reporter, forwarded to the tune's (one cell per trial: no ETA of its own)."""

    def __init__(self, rep: TuneReporter, named: bool = False):
        self.rep, self.named = rep, named  # named: trials side by side, each phase says whose

    def begin(self, folder: Path, total: int, done: int) -> None:
        pass

    def phase(self, cell: str, text: str) -> None:
        self.rep.phase(f"{cell.split('#')[0]}: {text}" if self.named else text)

    def cell_end(self, cell: str, state: str, reason: Optional[str], done: int, total: int,
                 eta_s: Optional[float]) -> None:
        pass

    def note(self, text: str) -> None:
        self.rep.note(text)


def optuna_module() -> Any:
    try:
        import optuna
    except ImportError:
        raise UsageError("servedeck tune needs Optuna, which is not installed here",
                         hint="pip install 'servedeck[tune]' (or pip install 'optuna>=4,<6')") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def trial_name(number: int) -> str:
    return f"t{number + 1}"


def ray_lanes(nodes: list[dict[str, Any]], cpus: float, gpus: int) -> int:
    """How many trials the size of the starter's cell (its CPUs, its GPUs) the alive Ray nodes can hold at once:
    per node, how many fit its CPUs and, when the cell takes GPUs, its GPUs; at least 1. Pure (`ray.nodes()` rows)."""
    total = 0
    for n in nodes:
        if not n.get("Alive", True):
            continue
        res = n.get("Resources") or {}
        k = int(res.get("CPU", 0) // cpus) if cpus > 0 else int(res.get("CPU", 0) > 0)
        if gpus:
            k = min(k, int(res.get("GPU", 0) // gpus))
        total += k
    return max(1, total)


def shared_hosts(nodes: list[dict[str, Any]]) -> list[str]:
    """Host names that more than one alive Ray node with CPUs for tasks runs on (several nodes on one machine, as in
    the tests): trials side by side there share its hardware. Pure (`ray.nodes()` rows)."""
    hosts = [n.get("NodeManagerHostname") or n.get("NodeManagerAddress") for n in nodes
             if n.get("Alive", True) and (n.get("Resources") or {}).get("CPU")]
    return sorted({h for h in hosts if h and hosts.count(h) > 1})


def crowded_nodes(nodes: list[dict[str, Any]], cpus: float, gpus: int) -> list[str]:
    """Alive nodes that Ray would give more than one trial at once with nothing of their own to measure on: a cell
    without GPUs, on a node with CPUs for several (a single `--ray local` node on a many-core host). Named by host
    and the Ray node's first 12 characters. Pure (`ray.nodes()` rows)."""
    if gpus:
        return []
    return [f"{n.get('NodeManagerHostname') or '?'} {str(n.get('NodeID') or '')[:12]}".strip() for n in nodes
            if n.get("Alive", True) and int((n.get("Resources") or {}).get("CPU", 0) // (cpus or 1)) > 1]


def _one_at_a_time() -> Placement:
    """The campaign's RayPlacement, its cells started one at a time (the verification: repeats interleaved, none
    measured beside another)."""
    from servedeck.cluster.dispatch import RayPlacement

    class OneAtATime(RayPlacement):
        def start_now(self, pending: list[C.Cell], running: list[C.Cell]) -> list[C.Cell]:
            return [] if running else list(pending[:1])

    return OneAtATime()


class TuneRun:
    """The one owner of a tune folder's trials while a servedeck runs it (tune.lock held)."""

    def __init__(self, cfg: Config, tune: Tune, resume: bool, reporter: Optional[TuneReporter] = None,
                 ray: Optional[str] = None, parallel: Optional[int] = None, storage: Optional[str] = None):
        self.cfg, self.rep = cfg, reporter or QuietTuneReporter()
        self.ray, self.parallel_opt = ray, parallel  # ray: the address given (connected by run_tune)
        self.runners: dict[str, Runner] = {}  # trial → its campaign's runner while it runs (Ctrl-C stops them)
        self.runners_lock = threading.Lock()
        self.optuna = optuna_module()
        root = tunes_root(cfg.deck.host.results_dir)
        found: Optional[Path] = None
        if resume:
            found = newest_unfinished(root, tune)
            if found is None:
                raise RunError(f"no unfinished tune {tune.name!r} from {tune.path} under {root}",
                               hint="start it anew without --resume")
            tune = parse((found / "tune.toml").read_text(), tune.path)  # the search as it began
        self.tune = tune
        self.base = C.derive(cfg, tune.camp).base  # refuses an unknown model before any folder exists
        if found is not None:
            self.folder = TuneFolder.open(found)
            self.at = S.for_resume(found, self.folder.doc, storage)
            self.storage = S.connect(self.optuna, self.at.url)
        else:  # a named database is reached before the folder is made: a wrong URL leaves nothing behind
            early = None
            if storage:
                S.check(storage)
                early = S.connect(self.optuna, storage)
            self.folder = TuneFolder.create(root, tune, self.base)
            self.at = S.for_new(self.folder.path, tune.name, storage)
            self.storage = early if early is not None else S.connect(self.optuna, self.at.url)
            self.folder.doc.update(storage=self.at.shown, study_name=self.at.name)
            self.folder.save()
        self.runs_root = runs_root(cfg.deck.host.results_dir)
        self.lock = FileLock(str(self.folder.path / "tune.lock"))

    def run(self) -> TuneFolder:
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            raise RefusedError(f"tune {self.tune.name} ({self.folder.path}) is being run by another servedeck",
                               hint="wait for it, or stop it (Ctrl-C in its terminal) before resuming") from None
        try:
            return self._run()
        finally:
            self.lock.release()

    def _sampler(self, told: int = 0) -> Any:
        """TPE drawing `startup` searched trials at random first; `told` finished trials the study holds that the
        search did not draw (the starter) are added, since Optuna counts every finished trial as a startup one."""
        opt = self.optuna
        sp = self.tune.space
        with warnings.catch_warnings():  # multivariate/group TPE are marked experimental
            warnings.simplefilter("ignore", opt.exceptions.ExperimentalWarning)
            return opt.samplers.TPESampler(seed=sp.seed, n_startup_trials=sp.startup_trials + told, multivariate=True,
                                           group=True)

    def _study(self) -> Any:
        return self.optuna.create_study(storage=self.storage, study_name=self.at.name, direction="maximize",
                                        sampler=self._sampler(), load_if_exists=True)

    # --- where trials run -----------------------------------------------------------------------
    def _placement(self) -> Optional[Placement]:
        if not self.ray:
            return None
        from servedeck.cluster.dispatch import RayPlacement

        return RayPlacement()

    def lanes(self) -> int:
        """Searched trials at once: 1 here; on Ray, --parallel, else [search] parallel, else as many starter-sized
        cells as the alive nodes hold (to_ask bounds each ask by what is left of the budget)."""
        if not self.ray:
            return 1
        if self.parallel_opt or self.tune.space.parallel:
            return int(self.parallel_opt or self.tune.space.parallel or 1)
        import ray

        return ray_lanes([n for n in ray.nodes() if n.get("Alive")], *self._cell_size())

    def _cell_size(self) -> tuple[float, int]:
        """The starter's cell as RayPlacement asks Ray for it: its CPUs (its pinned set, else one) and its GPUs
        (none when some node that may take it has none)."""
        import ray

        camp = self.tune.trial_campaign(STARTER, {})
        derived = C.derive(self.cfg, camp)
        [cell] = C.cell_list(camp, derived)
        ms = [derived.cfg.models[n] for n in cell.models]
        workers = [n for n in ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get("CPU")]
        gpus = max(cell.gpus) + 1 if cell.gpus else (sum(m.tp * m.pp * m.dp for m in ms) if workers and all(
            (n.get("Resources") or {}).get("GPU") for n in workers) else 0)
        return float(len(cell.cpus) or 1), gpus

    def _run(self) -> TuneFolder:
        study = self._study()
        redo = self._recover(study)
        lanes = self.lanes()
        if self.ray:
            import ray

            alive = [n for n in ray.nodes() if n.get("Alive")]
            shared = shared_hosts(alive) if lanes > 1 else []
            crowded = crowded_nodes(alive, *self._cell_size()) if lanes > 1 else []
            with self.folder.lock:
                self.folder.doc["ray"] = {"address": getattr(ray.get_runtime_context(), "gcs_address", None) or self.ray,
                                          "parallel": lanes, "nodes": sorted(n["NodeID"] for n in alive),
                                          "shared_hosts": shared, "crowded_nodes": crowded}
                self.folder.save()
            if shared or crowded:
                where = "; ".join(x for x in (f"Ray nodes on one host ({', '.join(shared)})" if shared else "",
                                              f"nodes that hold several trials on their CPUs ({', '.join(crowded)})"
                                              if crowded else "") if x)
                self.rep.note(f"{where}: trials side by side there share its CPUs and memory bandwidth, so each "
                              "measures the other's load beside its own; their figures are not comparable with the "
                              "starter's, measured alone")
        self.rep.begin(self.folder.path, self._finished(), self.tune.space.trials)
        started = time.monotonic()
        spent0 = float(self.folder.doc.get("spent_s") or 0.0)
        try:
            starter = self.folder.trial(STARTER)
            if starter is None or starter["state"] != DONE:
                v = self._trial(STARTER, None, {})
                if v.verdict == O.FAILED:  # every trial runs the same workloads on the same model: nothing to learn
                    self.folder.doc["finished"] = True
                    raise RunError(f"the starter (model {self.base} as models.toml has it) failed: {v.why}",
                                   hint="every trial runs the same workloads on the same model: fix what it names, "
                                        "then `servedeck tune FILE` again (a new tune)")
            self._starter_to_study(study)
            if lanes > 1:
                self._side_by_side(study, redo, lanes, lambda: spent0 + time.monotonic() - started)
            while lanes == 1 and O.trials_left(self._finished(), self.tune.space.trials,
                                               spent0 + time.monotonic() - started, self.tune.space.wall_s):
                ask, values = self._ask(study)
                name = self._name(ask.number)
                v = self._trial(name, ask.number, values, redo.pop(_key(values), None))
                self._tell(study, ask.number, v)
            with self.folder.lock:  # what tune.md shows of the search before its verification (tune show: afresh)
                self.folder.doc["importance"] = of_study(self.optuna, study)
                self.folder.save()
            self._verify()
            self.folder.doc["finished"] = True
        finally:
            self.folder.doc["spent_s"] = spent0 + time.monotonic() - started
            self.folder.save()
        return self.folder

    def _name(self, number: int) -> str:
        """A searched trial's name from its study number: t1 is the first asked (the starter, told to the study
        before it, takes number 0 where it lies in the space: `study_offset`)."""
        return trial_name(number - int(self.folder.doc.get("study_offset") or 0))

    def _starter_to_study(self, study: Any) -> None:
        """The starter's figure told to the study before the first ask, as a finished trial at the point its entry
        takes in the space (Space.point: the entry's values, else the engine's fixed defaults; knobs it has no known
        value for are left out). Without it TPE would model the space from the searched trials alone and could
        settle in a region far below the best point known, the entry it set out to beat. Once per tune; a tune
        whose study already has asked trials (one begun before this existed) is left as it is."""
        if "study_offset" in self.folder.doc:
            if self.folder.doc["study_offset"]:
                study.sampler = self._sampler(told=int(self.folder.doc["study_offset"]))
            return
        st = self.folder.trial(STARTER) or {}
        point: dict[str, Any] = {}
        told = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("servedeck") == STARTER]
        if told:  # told by a servedeck that stopped before it could record so
            point = dict(told[0].params)
        elif st.get("state") == DONE and st.get("verdict") in (O.MEASURED, O.NO_CAPACITY) \
                and st.get("value") is not None and not study.get_trials(deepcopy=False):
            point = self.tune.space.point(self._starter_values())
        if point and not told:
            opt = self.optuna
            dists = {k.name: (opt.distributions.IntDistribution(k.low, k.high, log=k.log, step=k.step)
                              if isinstance(k, IntRange) else
                              opt.distributions.CategoricalDistribution(k.labels if isinstance(k, Together)
                                                                        else list(k.values)))
                     for k in self.tune.space.knobs if k.name in point}
            study.add_trial(opt.trial.create_trial(params=point, distributions=dists, value=float(st["value"]),
                                                   user_attrs={"servedeck": STARTER}))
            self.rep.note("the starter told to the search at " + ", ".join(f"{k}={v}" for k, v in point.items())
                          + f" ({float(st['value']):.3g})")
        with self.folder.lock:
            self.folder.doc["study_offset"] = 1 if point else 0
            self.folder.doc["starter_point"] = point or None
            self.folder.save()
        if point:
            study.sampler = self._sampler(told=1)

    def _done_values(self, name: str) -> list[dict[str, Any]]:
        """The finished trials but `name`, each with its values; the starter's are its entry's for the searched
        keys, and only where the entry, the engine's fixed defaults or what it took at boot gives every one (in the
        decode-heavy llama.cpp tune of 2026-12-07, t3 drew the starter's values and was launched again, its threads
        then unknown)."""
        with self.folder.lock:
            trials = [dict(t) for t in self.folder.doc["trials"] if t["trial"] != name and t.get("state") == DONE]
        starter = self._starter_values()
        for t in trials:
            if t["trial"] == STARTER:
                t["values"] = starter if set(starter) == set(self.tune.space.keys) else None
        return trials

    def _starter_values(self) -> dict[str, Any]:
        """The starter's value for each key the space searches: its entry's, else the engine's fixed default, else
        what its engine took at boot, read from the starter's own log (llama.cpp's threads: one per physical core)."""
        model = self.cfg.models[self.base]
        build = self.cfg.deck.builds.get(model.build) if model.build else None
        engine = get_engine(build.engine) if build else None
        return known_values(self.tune.space.keys, model, engine, self._starter_booted(engine))

    def _starter_booted(self, engine: Any) -> dict[str, Any]:
        """Engine.booted_flags of the starter's engine log (its first run folder's server.log); {} before the starter
        ran, or where that log is not on this host (a Ray node's run not copied back)."""
        if engine is None:
            return {}
        for run in (self.folder.trial(STARTER) or {}).get("runs") or []:
            log = self.runs_root / run / "server.log"
            if log.exists():
                return dict(engine.booted_flags(log.read_text(errors="replace")))
        return {}

    def _ask(self, study: Any) -> tuple[Any, dict[str, Any]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self.optuna.exceptions.ExperimentalWarning)
            ask = study.ask()
            return ask, self.tune.space.sample(ask)

    def _side_by_side(self, study: Any, redo: dict[str, str], lanes: int, spent: Any) -> None:
        """Up to `lanes` searched trials at once, each on a thread (its campaign placed by Ray); asked and told
        here, on the main thread, each told as it ends. Ctrl-C or a trial stopped by an error stops the others
        (their engines stopped on their nodes): each is recorded interrupted and a resume redoes it."""
        running: dict[Future[O.Verdict], tuple[int, int]] = {}  # → (trial number, lane)
        pool = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="trial")
        try:
            while True:
                n = O.to_ask(self._finished(), len(running), self.tune.space.trials, lanes, spent(),
                             self.tune.space.wall_s)
                for _ in range(n):
                    ask, values = self._ask(study)
                    lane = min(set(range(lanes)) - {ln for _, ln in running.values()})
                    fut = pool.submit(self._trial, self._name(ask.number), ask.number, values,
                                      redo.pop(_key(values), None), lane)
                    running[fut] = (ask.number, lane)
                if not running:
                    return
                finished, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)  # Ctrl-C seen here
                for fut in finished:
                    number, _lane = running.pop(fut)
                    self._tell(study, number, fut.result())
        except BaseException:
            with self.runners_lock:
                runners = list(self.runners.values())
            for r in runners:
                try:
                    r.interrupt([c for c in r.cells if r.folder.cell(c.id)["state"] == C.CellState.RUNNING.value])
                except Exception as e:  # noqa: BLE001 - stopping the others must go on
                    self.rep.note(f"could not stop a trial's cell: {type(e).__name__}: {e}")
            wait(list(running), timeout=300)
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _finished(self) -> int:
        """Searched trials that count against `trials` (the starter is extra): every launched one with a verdict;
        a proposal refused before its launch is free (objective.counted)."""
        return O.counted([t.get("verdict") for t in self.folder.doc["trials"]
                          if t["trial"] != STARTER and t["state"] == DONE])

    def _tell(self, study: Any, number: int, v: O.Verdict) -> None:
        state = self.optuna.trial.TrialState
        if v.tell == O.COMPLETE:
            study.tell(number, v.value)
        elif v.tell == O.PRUNED:
            study.tell(number, state=state.PRUNED)

    def _recover(self, study: Any) -> dict[str, str]:
        """A resume: trials a Ctrl-C or a crash cut short are told failed, their engines stopped if a servedeck that
        is gone left them running, and their values asked again first (the same values, as a new trial). Returns
        which trial each re-asked set of values redoes."""
        state = self.optuna.trial.TrialState
        redo: dict[str, str] = {}
        cut = [t for t in self.folder.doc["trials"] if t["state"] in (RUNNING, INTERRUPTED)]
        fresh = [t["trial"] for t in cut if not t.get("redone")]  # not yet asked again by an earlier resume
        for t in cut:
            if t["state"] == RUNNING:
                self.folder.update_trial(t["trial"], state=INTERRUPTED,
                                         why=t.get("why") or "its servedeck is gone (killed, or the host restarted)")
            self._reap(t["trial"], t.get("values") or {})
        running = {ft.number for ft in study.get_trials(deepcopy=False, states=(state.RUNNING,))}
        known = {t["number"] for t in self.folder.doc["trials"]}
        for number in sorted(running - known):  # asked, then cut short before its trial was recorded: nothing ran
            study.tell(number, state=state.FAIL)
        for t in cut:
            if t["number"] is None or t.get("redone"):
                continue
            if t["number"] in running:
                study.tell(t["number"], state=state.FAIL)
            # the values it sampled, asked again first (a `when` left some knobs out: fixed ones only)
            params: dict[str, Any] = next((ft.params for ft in study.get_trials(deepcopy=False) if ft.number == t["number"]), {})
            study.enqueue_trial(params, skip_if_exists=False)
            redo[_key(t.get("values") or {})] = t["trial"]
            self.folder.update_trial(t["trial"], redone=True)
        if fresh:
            self.rep.note(f"resuming: {', '.join(fresh)} cut short; redone with the same values")
        return redo

    def _reap(self, trial: str, values: dict[str, Any]) -> None:
        """Engines of a cut-short trial whose servedeck is gone: stopped by process group, through the deck."""
        try:
            derived = C.derive(self.cfg, self.tune.trial_campaign(trial, values))
        except ServedeckError:
            return
        deck = Deck(derived.cfg)
        running = deck.running()
        mine = [n for n in derived.models.get(trial, ()) if n in running
                and not (running[n].owner_pid and P.alive(running[n].owner_pid))]
        if mine:
            deck.stop(mine, wait_s=60)
            self.rep.note(f"stopped {', '.join(mine)}, left running by a servedeck that is gone")

    # --- verification of the best few ----------------------------------------------------------------
    def _verify(self) -> None:
        """The best `top` trials and the starter launched again, `repeats` each, interleaved, as one campaign
        `<tune>.verify`; each launch's figure and the verdict (verify.py) recorded in tune.json. A resume continues
        a verification cut short (the same candidates, its campaign resumed: finished launches kept)."""
        f, sp = self.folder, self.tune.space
        ver = f.doc.get("verification")
        if sp.verify_top == 0 or (ver and ver.get("state") == DONE):
            return
        if not ver:
            names = V.candidates(f.doc["trials"], sp.verify_top)
            ver = {"state": RUNNING, "top": sp.verify_top, "repeats": sp.verify_repeats, "candidates": names,
                   "campaign": None, "order": [], "figures": {}, "verdict": None, "winner": None, "why": None,
                   "started": now_iso()}
            f.doc["verification"] = ver
            f.save()
        names = list(ver["candidates"])
        if not names:
            ver.update(state=DONE, **V.verdict({}, {}), ended=now_iso())
            f.save()
            return
        values = {n: (f.trial(n) or {}).get("values") or {} for n in names}
        camp = self.tune.verify_campaign(values, int(ver["repeats"]))
        self.rep.trial_start("verify", {"trials": ", ".join(names), "repeats": ver["repeats"]})
        done = self._verify_done(ver.get("campaign"))
        if done is None:
            runner = Runner(self.cfg, camp, RunOptions(resume=ver["campaign"] is not None), _CellNews(self.rep),
                            place=_one_at_a_time() if self.ray else None)
            ver["campaign"] = runner.folder.path.name
            ver["order"] = [c.id for c in runner.cells]
            f.save()
            try:
                runner.run()
            finally:
                ver["figures"] = self._figures(runner.folder.doc)
                f.save()
            done = runner.folder.doc
        ver["figures"] = self._figures(done)
        ver.update(state=DONE, ended=now_iso(), **V.verdict(ver["figures"], outputs_of(done)))
        f.doc["best"] = O.best(f.doc["trials"], self.tune.slo)
        f.save()
        self.rep.note(f"verification: {ver['verdict']}: {ver['why']}")

    def _verify_done(self, name: Optional[str]) -> Optional[dict[str, Any]]:
        """The verification campaign's record where every cell of it has finished (a servedeck that stopped between
        its last launch and the verdict), else None: it is run, or resumed."""
        if name is None:
            return None
        try:
            doc = CampaignFolder.open(campaigns_root(self.cfg.deck.host.results_dir) / name).doc
        except ServedeckError:
            return None
        if all(C.CellState(c["state"]).finished for c in doc.get("cells") or []):
            return dict(doc)
        return None

    def _figures(self, doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """Each variant's launches in the verification campaign, each with its figure under the tune's SLO."""
        out: dict[str, list[dict[str, Any]]] = {}
        for cell in doc.get("cells") or []:
            views = [load_run(self.runs_root / r) for r in cell.get("runs") or [] if (self.runs_root / r).exists()]
            rows = [r for r in capacity_rows([v for v in views if v.get("capacity")]) if r["slo"] == self.tune.slo]
            out.setdefault(cell["variant"], []).append(_jsonable(V.figure(cell, rows[0] if rows else None)) or {})
        return out

    # --- one trial ------------------------------------------------------------------------------
    def _trial(self, name: str, number: Optional[int], values: dict[str, Any], redoes: Optional[str] = None,
               lane: int = 0) -> O.Verdict:
        f = self.folder
        f.begin_trial(name, number, values, redoes)
        self.rep.trial_start(name, values)
        t0 = time.monotonic()
        verdict: Optional[O.Verdict] = None
        try:
            verdict = self._measure(name, values, lane)
        except KeyboardInterrupt:
            f.update_trial(name, state=INTERRUPTED, why="interrupted (Ctrl-C); `servedeck tune FILE --resume` "
                                                        "redoes it with the same values")
            raise
        except ServedeckError as e:  # not the trial's fault (models of yours in the way, a full disk): said, kept
            f.update_trial(name, state=INTERRUPTED, why=f"stopped: {e.message}")
            raise
        finally:
            f.update_trial(name, ended=now_iso(), duration_s=round(time.monotonic() - t0, 1))
        if verdict.verdict == O.INTERRUPTED:
            # the cell's reason names the campaign's resume; a tune's trial is redone by the tune's
            f.update_trial(name, state=INTERRUPTED, why=f"interrupted (Ctrl-C); `servedeck tune FILE "
                                                        f"{'--ray … ' if self.ray else ''}--resume` redoes it with "
                                                        f"the same values (its cell: {verdict.why})")
            raise KeyboardInterrupt
        with f.lock:
            f.update_trial(name, state=DONE, **verdict.to_json())
            f.doc["best"] = O.best(f.doc["trials"], self.tune.slo)
            f.save()
        from servedeck.tune.folder import best_sentence

        self.rep.trial_end(name, f.trial(name) or {}, best_sentence(f.doc["best"]))
        return verdict

    def _measure(self, name: str, values: dict[str, Any], lane: int = 0) -> O.Verdict:
        f, sp = self.folder, self.tune.space
        again = O.repeat_of(values, self._done_values(name))
        if again is not None:
            return again
        broken = sp.broken_rules(values)
        if broken:
            return O.before_launch(broken, []) or O.Verdict(O.BROKE_RULE, O.PRUNED)
        floor = self._floor(name)
        try:
            camp = self.tune.trial_campaign(name, values, lane, self._reference_run(name),
                                            floor["value"] if floor else None)
            derived = C.derive(self.cfg, camp)
        except ConfigError as e:
            return O.Verdict(O.INVALID, O.PRUNED, why=e.message.replace(f"{self.tune.path}: ", ""))
        fits = self._fits(derived, name)
        f.update_trial(name, fit=[{k: x.get(k) for k in ("model", "status", "message")} for x in fits])
        pre = O.before_launch([], fits)
        if pre is not None:
            return pre
        try:
            runner = Runner(self.cfg, camp, RunOptions(), _CellNews(self.rep, named=bool(self.ray)),
                            place=self._placement())
        except ConfigError as e:
            return O.Verdict(O.INVALID, O.PRUNED, why=e.message.replace(f"{self.tune.path}: ", ""))
        port = derived.cfg.models[derived.models[name][0]].port if derived.models.get(name) else None
        f.update_trial(name, campaign=runner.folder.path.name, port=port, floor=floor,
                       **({"lane": lane, "placed": "ray"} if self.ray else {}))
        with self.runners_lock:
            self.runners[name] = runner
        try:
            runner.run()
        finally:
            with self.runners_lock:
                self.runners.pop(name, None)
            doc = runner.folder.doc
            c0 = (doc.get("cells") or [{}])[0]
            f.update_trial(name, runs=[r for c in doc["cells"] for r in c.get("runs") or []],
                           **({"node": c0.get("node"), "ray_node_id": c0.get("ray_node_id"),
                               "cell_started": c0.get("started"), "cell_ended": c0.get("ended")} if self.ray else {}))
        cell = doc["cells"][0]
        rows = [r for r in capacity_of(doc, self.runs_root) if r["slo"] == self.tune.slo]
        row = rows[0] if rows else None
        outputs = self._outputs(name, cell) if sp.check_outputs else None
        f.update_trial(name, row=_jsonable(row), outputs=outputs)
        return O.judge(cell, row, outputs, floor)

    def _fits(self, derived: C.Derived, name: str) -> list[dict[str, Any]]:
        """The planner's verdict on each replica, as `campaign plan` reads it (unknown on a host without GPUs)."""
        from servedeck.gpu import fit_now, inventory

        inv = inventory()
        return [fit_now(derived.cfg, m, inv=inv).to_json() for m in derived.models[name]]

    def _outputs_run(self, cell: dict[str, Any]) -> Optional[Path]:
        return next((self.runs_root / r for r in cell.get("runs") or []
                     if (self.runs_root / r / "outputs.jsonl").exists()), None)

    def _floor(self, name: str) -> Optional[dict[str, Any]]:
        """The figure a searched trial's capacity search is held to (campaign stop_below): the leader's good req/s
        per GPU by the verdict rules when the trial starts, {"value", "trial"}; None for the starter, with prune =
        false, or before any trial has a figure that may be served."""
        if name == STARTER or not self.tune.space.prune:
            return None
        with self.folder.lock:
            best = O.best(self.folder.doc.get("trials") or [], self.tune.slo)
        value = best.get("goodput_per_gpu")
        if best.get("verdict") not in ("recommended", "undecided") or not value or value <= 0:
            return None
        return {"value": float(value), "trial": best.get("leading")}

    def _reference_run(self, name: str) -> Optional[str]:
        """The starter's output-check run (its path) that a searched trial's check is held against as soon as it is
        answered, where a trial whose answers differ is refused: None for the starter, where outputs may differ or
        are not checked, or the starter left no such run."""
        sp = self.tune.space
        if name == STARTER or not sp.check_outputs or sp.outputs_may_differ:
            return None
        run = (self.folder.trial(STARTER) or {}).get("outputs_run")
        return str(self.runs_root / run) if run else None

    def _outputs(self, name: str, cell: dict[str, Any]) -> Optional[dict[str, Any]]:
        mine = self._outputs_run(cell)
        if name == STARTER:
            self.folder.update_trial(name, outputs_run=mine.name if mine else None)
            return {"reference": STARTER, "may_differ": False, "check": "reference"}
        starter = self.folder.trial(STARTER) or {}
        ref = self.runs_root / starter["outputs_run"] if starter.get("outputs_run") else None
        if mine is None or ref is None:
            return O.outputs_check(None, self.tune.space.outputs_may_differ)
        return O.outputs_check(compare_runs(ref, mine), self.tune.space.outputs_may_differ)


def _key(values: dict[str, Any]) -> str:
    return repr(sorted(values.items()))


def _jsonable(row: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    import json

    return None if row is None else json.loads(json.dumps(row, default=str))


def run_tune(cfg: Config, tune: Tune, resume: bool, reporter: Optional[TuneReporter] = None,
             ray: Optional[str] = None, parallel: Optional[int] = None, storage: Optional[str] = None) -> TuneFolder:
    """ray: a cluster's address (`auto`, `local`, host:port): every trial a campaign cell placed by Ray. storage: the
    study's database URL (storage.py; default study.db in the tune folder)."""
    if not ray:
        return TuneRun(cfg, tune, resume, reporter, parallel=parallel, storage=storage).run()
    from servedeck.cluster.connect import connected

    with connected(ray):
        return TuneRun(cfg, tune, resume, reporter, ray=ray, parallel=parallel, storage=storage).run()
