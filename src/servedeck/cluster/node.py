"""What runs on a Ray node: one campaign cell, and the node's facts for `servedeck hosts`/preflight.

A cell task is servedeck's own cell work, runner.CellHere (its steps under its cell_timeout, its engines
stopped), the same as one host's, on this node, with this node's SERVEDECK_HOME (deck state, locks) and
results dir; the models.toml and campaign file arrive as text in the payload. The campaign's record is
the head's alone: the node keeps none and writes no campaign folder. The cell reports through `NodeNews`,
the CellNews a local thread reports through; the task is a streaming generator that sends that news on:
while the cell runs it yields the cell's phases, notes and run folder names, and, when this node's
results dir is not the head's, what changed in those folders (file contents, so no shared filesystem is
needed); the head writes them into its own results dir as they come, so a node that dies mid-cell
leaves the head everything it had sent. When the node's results dir is the head's (one host, or a
shared filesystem: the node finds the head's campaign folder there with this campaign's token), its run
folders already are where the head's readers look and only their names travel. Its last item is how the
cell's work ended (state, reason, signature, runs). The head replays each item onto its runner's
CellNews (phase, note, run_made, placed): the calls a cell's thread makes there.

GPUs: the task asks Ray for the cell's GPU count; Ray sets CUDA_VISIBLE_DEVICES for the worker and
`ray.get_gpu_ids()` names the physical GPUs it granted. A variant's `gpus` are positions within that
grant (gpus = [0, 1] → the first two GPUs Ray gave this cell); without `gpus`, replicas take the
grant in order, tp × pp × dp each. The derived model entries are rewritten to the physical indices
before the deck renders them, so the engine's CUDA_VISIBLE_DEVICES, the NVML fit check and the
holder checks all speak of the same GPUs.

Engines outlive a dead parent by design (their own process group); on a node the worker that
started them is their owner: the shim watches it (SERVEDECK_ENGINE_OWNER) and stops its engine if
the worker dies without stopping it (node lost, worker killed).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Optional

from servedeck import __version__, paths
from servedeck.campaign import cells as C
from servedeck.campaign.file import parse as parse_campaign
from servedeck.campaign.folder import campaigns_root
from servedeck.campaign.runner import CellHere, check_host
from servedeck.campaign.steps import CellSteps
from servedeck.config import Config
from servedeck.deck import Deck
from servedeck.errors import ConfigError, ServedeckError
from servedeck.modelsfile import parse as parse_models
from servedeck.runs.folder import runs_root
from servedeck.supervisor.process import ENGINE_OWNER_ENV  # spawn passes it to the shim as --owner

SYNC_S = 1.0  # how often a running cell sends what changed in its run folders


def identity() -> dict[str, Any]:
    import ray

    return {"host": socket.gethostname(), "ray_node_id": ray.get_runtime_context().get_node_id()}


class NodeNews:
    """The cell's CellNews on this node: phases, notes, run folders and placement fields, kept for the next
    sync (the head replays them onto its runner's CellNews)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[str, str]] = []
        self._runs: list[str] = []
        self._placed: dict[str, Any] = {}

    def phase(self, cell: str, text: str) -> None:
        with self._lock:
            self._items.append(("phase", text))

    def note(self, text: str) -> None:
        with self._lock:
            self._items.append(("note", text))

    def run_made(self, cell: str, run: str) -> None:
        with self._lock:
            if run not in self._runs:
                self._runs.append(run)

    def placed(self, cell: str, **fields: Any) -> None:
        with self._lock:
            self._placed.update(fields)

    def runs(self) -> list[str]:
        with self._lock:
            return list(self._runs)

    def drain(self) -> tuple[list[tuple[str, str]], dict[str, Any]]:
        """The phases and notes, and placement fields, since the last call."""
        with self._lock:
            items, self._items = self._items, []
            placed, self._placed = self._placed, {}
        return items, placed


def place_gpus(derived: C.Derived, cell: C.Cell, granted: list[int]) -> C.Derived:
    """The derived model entries with the cell's GPUs rewritten from positions in Ray's grant to physical
    indices (a new Derived; `derived` is left as it was)."""
    if not granted:
        return derived
    models = dict(derived.cfg.deck.models)
    pos = 0
    for name in cell.models:
        m = models[name]
        if m.gpus:
            beyond = [g for g in m.gpus if g >= len(granted)]
            if beyond:
                raise ConfigError(f"variants.{cell.variant}.gpus: position(s) {beyond} but Ray gave this cell "
                                  f"{len(granted)} GPU(s) (physical {granted})",
                                  hint="under --ray, gpus are positions within the cell's grant, from 0")
            phys = [granted[g] for g in m.gpus]
        else:
            n = m.tp * m.pp * m.dp
            phys, pos = granted[pos:pos + n], pos + n
        models[name] = m.model_copy(update={"gpus": phys})
    deck = derived.cfg.deck.model_copy(update={"models": models})
    return replace(derived, cfg=Config(path=derived.cfg.path, deck=deck))


def shares_head_results(results_dir: Optional[str], head_folder: str, token: str) -> bool:
    """Whether this node's results dir is the head's own: the head's campaign folder is in it, carrying
    this campaign's token (a folder of the same name on another disk does not). Then every run folder the
    node writes is already where the head's readers look."""
    try:
        doc = json.loads((campaigns_root(results_dir) / head_folder / "campaign.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(token) and (doc.get("cluster") or {}).get("results_token") == token


def _changed(root: Path, runs: list[str], sent: dict[str, tuple[int, int]]) -> dict[str, dict[str, bytes]]:
    """Files of these run folders that are new or changed since the last call (whole contents)."""
    out: dict[str, dict[str, bytes]] = {}
    for run in runs:
        base = root / run
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or path.name.endswith(".tmp") or path.name.startswith("."):  # atomic writes in progress
                continue
            try:
                st = path.stat()
                key = f"{run}/{path.relative_to(base)}"
                if sent.get(key) == (st.st_size, st.st_mtime_ns):
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            sent[key] = (st.st_size, st.st_mtime_ns)
            out.setdefault(run, {})[str(path.relative_to(base))] = data
    return out


def run_cell(payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Ray task body (dispatch.py wraps it in ray.remote). Payload: models_toml, models_path,
    campaign_toml, campaign_path, cell, evict, head_folder (the name of the head's campaign folder),
    results_token (what the head wrote in it, to know it again)."""
    import ray

    me = identity()
    os.environ[ENGINE_OWNER_ENV] = str(os.getpid())
    cfg = parse_models(payload["models_toml"], payload["models_path"])
    if not os.environ.get("SERVEDECK_RESULTS") and not cfg.deck.host.results_dir:
        # a worker's working directory is Ray's; the node's own results live in its servedeck home
        os.environ["SERVEDECK_RESULTS"] = str(paths.home() / "results")
    camp = parse_campaign(payload["campaign_toml"], Path(payload["campaign_path"]))
    derived = C.derive(cfg, camp)
    granted = [int(g) for g in ray.get_gpu_ids()]
    derived = place_gpus(derived, next(c for c in C.cell_list(camp, derived) if c.id == payload["cell"]), granted)
    cells = C.cell_list(camp, derived)
    check_host(camp, cells)  # this node's CPU sets, as `campaign run` checks one host's
    cell = next(c for c in cells if c.id == payload["cell"])
    results = runs_root(cfg.deck.host.results_dir)
    steps = CellSteps(derived, camp, results, payload["head_folder"], me, evict=bool(payload.get("evict")))
    here = CellHere(steps, cell, camp)  # the same cell work as one host's
    news = NodeNews()
    in_place = shares_head_results(cfg.deck.host.results_dir, payload["head_folder"], payload.get("results_token", ""))
    yield {"kind": "started", **me, "gpus": granted, "pid": os.getpid(), "runs_in_place": in_place,
           "models": {n: list(derived.cfg.models[n].gpus) for n in cell.models}}
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["ending"] = here.run(news)
        except BaseException as e:  # KeyboardInterrupt, SystemExit: CellHere turns the rest into its ending
            box["error"] = f"{type(e).__name__}: {e}"

    sent: dict[str, tuple[int, int]] = {}

    def sync() -> dict[str, Any]:
        runs = news.runs()
        items, placed = news.drain()
        return {"kind": "sync", "files": {} if in_place else _changed(results, runs, sent), "items": items,
                "runs": runs, **({"placed": placed} if placed else {})}

    told: list[str] = []
    t = threading.Thread(target=work, name=f"cell {cell.id}", daemon=True)
    try:
        t.start()
        while t.is_alive():
            t.join(SYNC_S)
            msg = sync()
            if msg["files"] or msg["items"] or msg.get("placed") or msg["runs"] != told:
                told = msg["runs"]
                yield msg
        last = sync()
        yield last
        ending: Optional[C.Ending] = box.get("ending")
        yield {"kind": "end", "error": box.get("error"),
               "cell": {"state": ending.state.value if ending else C.CellState.FAILED.value,
                        "reason": ending.reason if ending else None,
                        "signature": ending.signature if ending else None, "runs": last["runs"]}}
    except BaseException:
        # the head's Ctrl-C (ray.cancel raises KeyboardInterrupt here): stop this cell's engines by
        # process group; its work ends at its next step and stops them through the deck
        here.stop()
        t.join(120)
        raise


def stop_cell(payload: dict[str, Any]) -> dict[str, Any]:
    """After the head's Ctrl-C, pinned to the node that ran the cell: stop the cell's engines through this
    node's deck (process group, live record and wanted state cleared), whatever the cancelled task got to
    do. The head waits for it, so when `campaign run` exits nothing of the cell runs anywhere."""
    cfg = parse_models(payload["models_toml"], payload["models_path"])
    camp = parse_campaign(payload["campaign_toml"], Path(payload["campaign_path"]))
    derived = C.derive(cfg, camp)
    cell = next(c for c in C.cell_list(camp, derived) if c.id == payload["cell"])
    # every model of the cell, under the deck's lock, not only those found running: the cancelled task
    # may have killed an engine whose record its own stop never got to settle before the head exited
    # (its worker goes with the head), and this node's deck would then say it was still live
    rows = Deck(derived.cfg).stop(list(cell.models), wait_s=120)
    return {**identity(), "stopped": [r["model"] for r in rows if r["outcome"] == "stopped"]}


def facts(models_toml: Optional[str], models_path: Optional[str], model: Optional[str],
          builds: Optional[list[str]] = None) -> dict[str, Any]:
    """This node: host, Ray node id, CPUs, GPUs (NVML), servedeck version, and the doctor's rows for
    what a campaign needs here (config, builds, weights of `model`). Never raises for a bad node:
    what is wrong is in the rows."""
    from servedeck.doctor.build import verify_build
    from servedeck.doctor.checks import FAIL, OK, Row, build_rows, check_weights
    from servedeck.gpu.nvml import inventory
    from servedeck.hostcpu import usable_cpus

    inv = inventory()
    out: dict[str, Any] = {
        **identity(), "servedeck": __version__, "cpus": os.cpu_count(), "usable_cpus": len(usable_cpus()),
        "gpus": [{"index": g.index, "name": g.name, "memory_total": g.memory_total, "memory_free": g.memory_free}
                 for g in inv.gpus] if inv.available else [],
        "gpu_note": None if inv.available else inv.reason, "rows": [], "doctor": "not run"}
    if models_toml is None or models_path is None:
        return out
    rows: list[Row] = []
    try:
        cfg = parse_models(models_toml, models_path)
        rows.append(Row("config", "", OK, f"{models_path}: parsed here"))
        names = [cfg.resolve(model)] if model else sorted(cfg.models)
        for b in sorted(set(builds or []) | {cfg.models[n].build for n in names}):
            if b in cfg.deck.builds:
                rows += build_rows(b, verify_build(cfg.deck.builds[b], b, cfg, integrity=False))
        rows += [check_weights(cfg, n) for n in names]
    except ServedeckError as e:
        rows.append(Row("config", "", FAIL, e.message, e.hint or "fix models.toml"))
    out["rows"] = [r.to_json() for r in rows]
    out["doctor"] = "FAIL" if any(r.status == FAIL for r in rows) else "OK"
    return out
