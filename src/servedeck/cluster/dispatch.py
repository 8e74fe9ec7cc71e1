"""The head of a campaign on Ray: the campaign folder here, every cell a Ray task on some node.

    preflight   the doctor on every alive node (config, builds, weights the campaign names), as a
                Ray task pinned to that node: the campaign is refused with the node and the missing
                item named before anything starts; a variant's `host` that no node offers is refused too
    run         one task per cell, all submitted at once: Ray queues each until a node has its GPUs,
                CPUs and host; each cell's files come back into this head's results dir as they are
                written (runs/NAME/…), unless the node's results dir is this one (it found this
                campaign's token in it): then its run folders are already here and only their names
                come; campaign.json says which node ran it
    node lost   the cell is recorded failed, "node lost", with whatever run folders had arrived; it is
                tried again on another alive node that fits, `retries` times (campaign file, default 1)
    Ctrl-C      every running task is cancelled: each node stops its cell's engines by process group
                and the cell goes back to pending for `--resume`

The runner (campaign/runner.py) is the same as on one host: it owns every cell's state and how a cell
ends; `RayPlacement` is the placement it is given. On the node the cell is the same CellHere as on one
host, reporting to a node.NodeNews; its stream is replayed here onto the runner's `CellNews`, the calls
a local thread makes.

Run folder names are made on the nodes; one sent here that collides with another cell's is renamed
with a suffix (campaign.json lists the name it has here). A folder written in place keeps its name.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any, Optional

from servedeck.campaign import cells as C
from servedeck.campaign.file import Campaign
from servedeck.campaign.runner import CampaignReporter, Placement, RunOptions, Runner
from servedeck.campaign.steps import CellNews
from servedeck.cluster import node as N
from servedeck.config import Config
from servedeck.deck import state as S
from servedeck.errors import RefusedError
from servedeck.fsio import atomic_write_bytes, unique_dir
from servedeck.runs.folder import RunFolder

HOST_SHARE = 0.001  # a variant's `host` as a custom resource: a sliver of it, so cells can share the host
CANCEL_WAIT_S = 180.0  # after Ctrl-C, how long the head waits for nodes to stop their engines
# before a node-loss retry: a node Ray declared dead may still be running (a partition, or several
# nodes on one machine as in the tests); its engines stop within seconds of losing their worker
RETRY_PAUSE_S = 8.0


def _is_node_loss(e: BaseException) -> bool:
    from ray import exceptions as X

    return isinstance(e, (X.NodeDiedError, X.WorkerCrashedError, X.LocalRayletDiedError)) or \
        isinstance(getattr(e, "cause", None), (X.NodeDiedError, X.WorkerCrashedError))


class RayPlacement(Placement):
    """Every cell a Ray task, all submitted at once: Ray queues each until a node has its GPUs, CPUs and
    host. cell_timeout is kept on the node, by its CellHere (the head's clock would count the wait for a node)."""

    parallel = True
    resume_hint = "servedeck campaign run FILE --ray … --resume"
    cancel_wait_s: Optional[float] = CANCEL_WAIT_S

    def __init__(self) -> None:
        import ray

        self.ray = ray
        self.task = ray.remote(max_retries=0)(N.run_cell)
        self.inflight: dict[str, Any] = {}
        self.names: dict[tuple[str, str], str] = {}  # (cell, run name on its node) → name here
        self.names_lock = threading.Lock()
        self.lost: set[str] = set()  # Ray node ids lost during this campaign
        self.where: dict[str, str] = {}  # cell → the Ray node id running it now
        # written into campaign.json: a node that finds it in its own results dir shares this one
        self.results_token = secrets.token_hex(8)
        self.in_place: dict[str, bool] = {}  # cell → its node writes its run folders in this results dir

    # check: none here; CPU sets are the nodes' business (each node checks its own)

    # --- before anything starts ---------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def _matches(self, n: dict[str, Any], host: str) -> bool:
        labels = n.get("Labels") or {}
        return host in (n.get("Resources") or {}) or host in labels.values() or \
            host in (n.get("NodeManagerHostname"), n.get("NodeName"), n.get("NodeManagerAddress"))

    def _host_ask(self, host: Optional[str]) -> dict[str, Any]:
        """The options that put a cell on its variant's host: a custom resource, else node affinity."""
        if not host:
            return {}
        nodes = [n for n in self.nodes() if self._matches(n, host)]
        if any(host in (n.get("Resources") or {}) for n in nodes):
            return {"resources": {host: HOST_SHARE}}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[0]["NodeID"], soft=False)} if nodes else {}

    def gpus_of(self, cell: C.Cell) -> int:
        """The GPUs the cell asks Ray for. With `gpus` named, they are positions within the grant, so the
        cell asks for max(position) + 1. Without, tp × pp × dp per replica when the nodes it may land on
        have GPUs (its host's nodes, or every worker node when it names no host), else none: a CPU cell
        on a CPU node. Ray hides the GPUs a task did not ask for (CUDA_VISIBLE_DEVICES empty)."""
        if cell.gpus:
            return max(cell.gpus) + 1
        host = self.runner.camp.variant(cell.variant).host
        nodes = [n for n in self.nodes() if (n.get("Resources") or {}).get("CPU")]
        if host:
            nodes = [n for n in nodes if self._matches(n, host)]
        if not nodes or not all((n.get("Resources") or {}).get("GPU") for n in nodes):
            return 0
        return sum(m.tp * m.pp * m.dp for m in (self.runner.derived.cfg.models[n] for n in cell.models))

    def cpus_of(self, cell: C.Cell) -> float:
        """The engine's CPUs (its pinned set, else one) for the whole cell; the client shares them, as on
        one host."""
        return float(len(cell.cpus) or 1)

    def prepare(self, runner: Runner) -> list[C.Cell]:
        self.runner = runner
        self.models_toml = runner.user_cfg.path.read_text()
        todo = runner.todo()
        self.preflight(todo)
        return todo

    def preflight(self, todo: list[C.Cell]) -> list[dict[str, Any]]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        r = self.runner
        nodes = self.nodes()
        problems: list[str] = []
        for v in r.camp.variants:
            if v.host and not any(self._matches(n, v.host) for n in nodes):
                problems.append(f"variants.{v.name}.host = {v.host!r}: no alive node offers it (nodes: "
                                + ", ".join(f"{n.get('NodeManagerHostname')} {sorted(k for k in n['Resources'] if not k.startswith(('node:', 'CPU', 'GPU', 'memory', 'object_store')))}"
                                            for n in nodes) + ")")
        builds = sorted({r.derived.cfg.models[n].build for c in todo for n in c.models})
        facts_task = self.ray.remote(num_cpus=0, max_retries=0)(N.facts)
        refs = {n["NodeID"]: facts_task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            self.models_toml, str(r.user_cfg.path), r.derived.base, builds) for n in nodes}
        seen = []
        for node_id, ref in refs.items():
            try:
                f = self.ray.get(ref, timeout=300)
            except Exception as e:
                problems.append(f"node {node_id[:12]}: the doctor could not run there: {type(e).__name__}: {e}")
                continue
            seen.append(f)
            for row in f["rows"]:
                if row["status"] == "FAIL":
                    problems.append(f"node {f['host']} ({node_id[:12]}): {row['check']} {row['subject']}: {row['saw']}"
                                    + (f" — {row['action']}" if row.get("action") else ""))
        if problems:
            raise RefusedError("campaign refused before anything started:\n" + "\n".join(problems),
                               hint="install what is missing on those nodes (servedeck, the builds, the weights), "
                                    "or fix the variant's host; `servedeck hosts` shows every node")
        r.folder.doc["cluster"] = {"address": getattr(self.ray.get_runtime_context(), "gcs_address", None),
                                   "results_token": self.results_token,
                                   "nodes": [{k: f[k] for k in ("host", "ray_node_id", "cpus", "servedeck", "doctor")}
                                             | {"gpus": len(f["gpus"])} for f in seen]}
        r.folder.save()
        return seen

    # --- the cells ------------------------------------------------------------------------------
    def start_now(self, pending: list[C.Cell], running: list[C.Cell]) -> list[C.Cell]:
        return list(pending)  # all at once: Ray places them (side by side where the nodes have room)

    def lanes(self) -> int:
        return max(1, len(self.inflight))

    def stop(self, cells: list[C.Cell]) -> None:
        self.runner.note("Ctrl-C: cancelling every running cell; each node stops its engines")
        where = dict(self.where)
        for gen in list(self.inflight.values()):
            try:
                self.ray.cancel(gen)
            except Exception:
                pass
        self._stop_on_nodes(where)

    def _stop_on_nodes(self, where: dict[str, str]) -> None:
        """A stop task on each node that was running a cell, waited for (cancel alone returns at once)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        r = self.runner
        task = self.ray.remote(num_cpus=0, max_retries=0)(N.stop_cell)
        refs = {cid: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            self._payload(next(c for c in r.cells if c.id == cid), 0)) for cid, node_id in where.items()}
        for cid, ref in refs.items():
            try:
                got = self.ray.get(ref, timeout=CANCEL_WAIT_S)
                if got["stopped"]:
                    r.note(f"{cid}: stopped {', '.join(got['stopped'])} on {got['host']}")
            except Exception as e:
                r.note(f"{cid}: could not stop its engines on node {where[cid][:12]}: {type(e).__name__}: {e}")
        for cid in where:
            self._mark_unfinished(cid, "interrupted (Ctrl-C on the campaign's head); what the node had sent is kept")

    def _payload(self, cell: C.Cell, attempt: int) -> dict[str, Any]:
        r = self.runner
        return {"models_toml": self.models_toml, "models_path": str(r.user_cfg.path),
                "campaign_toml": r.camp.text, "campaign_path": str(r.camp.path), "cell": cell.id,
                "evict": r.opts.evict, "head_folder": r.folder.path.name,
                "results_token": self.results_token, "attempt": attempt}

    def run(self, cell: C.Cell, news: CellNews) -> C.Ending:
        """Attempts of one cell: another alive node after a node loss, `retries` times."""
        r = self.runner
        earlier = list(r.folder.cell(cell.id).get("earlier_runs") or [])
        attempts: list[dict[str, Any]] = []
        news.placed(cell.id, node=None, ray_node_id=None, attempts=attempts)
        state, reason, signature = C.CellState.FAILED, None, None
        for attempt in range(1 + r.camp.head.retries):
            if r.interrupted.is_set():
                break
            if attempt:  # the record starts again: the lost attempt's runs are earlier runs now
                news.placed(cell.id, runs=[], earlier_runs=earlier, reason=None, signature=None, started=S.now_iso(),
                            ended=None, node=None, ray_node_id=None, attempts=attempts)
            state, reason, signature, info = self._attempt(cell, attempt, news)
            attempts.append({"node": info.get("host"), "ray_node_id": info.get("ray_node_id"), "state": state.value,
                             "reason": reason, "runs": list(r.folder.cell(cell.id).get("runs") or [])})
            if state == C.CellState.FAILED and info.get("lost") and attempt < r.camp.head.retries:
                earlier = earlier + attempts[-1]["runs"]
                news.note(f"{cell.id}: {reason}; retrying on another node in {RETRY_PAUSE_S:.0f} s")
                if r.interrupted.wait(RETRY_PAUSE_S):
                    break
                continue
            break
        return C.Ending(state, reason, signature, fields={"attempts": attempts, "earlier_runs": earlier})

    def _options(self, cell: C.Cell) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.cpus_of(cell), "num_gpus": self.gpus_of(cell)}
        opts.update(self._host_ask(self.runner.camp.variant(cell.variant).host))
        if self.lost and "scheduling_strategy" not in opts:
            # a retry: on another alive node that fits (Ray has no anti-affinity; name one that is not lost)
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            need = {"CPU": opts["num_cpus"], "GPU": opts["num_gpus"], **opts.get("resources", {})}
            fits = [n for n in self.nodes() if n["NodeID"] not in self.lost
                    and all((n.get("Resources") or {}).get(k, 0) >= v for k, v in need.items() if v)]
            if fits:
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(fits[0]["NodeID"], soft=False)
        return opts

    def _attempt(self, cell: C.Cell, attempt: int,
                 news: CellNews) -> tuple[C.CellState, Optional[str], Optional[str], dict[str, Any]]:
        from ray import exceptions as X

        r = self.runner
        payload = self._payload(cell, attempt)
        info: dict[str, Any] = {}
        news.phase(cell.id, "waiting for a node" + (f" (attempt {attempt + 1})" if attempt else ""))
        gen = self.task.options(**self._options(cell)).remote(payload)
        self.inflight[cell.id] = gen
        try:
            for ref in gen:
                msg = self.ray.get(ref)
                if msg["kind"] == "started":
                    info.update(msg)
                    self.where[cell.id] = msg["ray_node_id"]
                    self.in_place[cell.id] = bool(msg.get("runs_in_place"))
                    news.placed(cell.id, node=msg["host"], ray_node_id=msg["ray_node_id"],
                                node_gpus=msg["gpus"] or None)
                    news.phase(cell.id, f"on {msg['host']} ({msg['ray_node_id'][:8]})")
                elif msg["kind"] == "sync":
                    self._receive(cell, msg, news)
                elif msg["kind"] == "end":
                    rec = msg["cell"]
                    if msg.get("error"):
                        return C.CellState.FAILED, f"servedeck failed on {info.get('host')}: {msg['error']}", None, info
                    return C.CellState(rec["state"]), rec.get("reason"), rec.get("signature"), info
            return C.CellState.FAILED, f"the task on {info.get('host')} ended without a result", None, info
        except X.TaskCancelledError:
            return C.CellState.PENDING, "cancelled", None, info
        except Exception as e:
            if _is_node_loss(e):
                node = info.get("ray_node_id") or "?"
                self.lost.add(node)
                info["lost"] = True
                self._mark_unfinished(cell.id, f"node lost: {info.get('host')} (Ray node {node[:12]}) died while "
                                               "this run was being written; what it had sent is kept")
                return (C.CellState.FAILED, f"node lost: {info.get('host', '?')} (Ray node {node[:12]}) died mid-cell; "
                        f"partial run folders kept", None, info)
            if isinstance(e, X.RayTaskError) and isinstance(e.cause, (KeyboardInterrupt, X.TaskCancelledError)):
                return C.CellState.PENDING, "cancelled", None, info
            msg = getattr(getattr(e, "cause", None), "message", None) if isinstance(e, X.RayTaskError) else None
            return C.CellState.FAILED, f"on {info.get('host', 'a node')}: {msg or f'{type(e).__name__}: {e}'}"[:2000], None, info
        finally:
            self.inflight.pop(cell.id, None)
            if not r.interrupted.is_set():
                self.where.pop(cell.id, None)

    def _receive(self, cell: C.Cell, msg: dict[str, Any], news: CellNews) -> None:
        """A node's news (node.NodeNews), onto the runner's CellNews as a local thread calls it; files first."""
        for kind, text in msg.get("items") or []:
            if kind == "phase":
                news.phase(cell.id, text)
            else:
                news.note(f"{cell.id}: {text}")
        for run, files in (msg.get("files") or {}).items():
            base = self.runner.runs_root / self._name_here(cell, run)
            for rel, data in files.items():
                path = base / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(path, data)
        for run in msg.get("runs") or []:
            news.run_made(cell.id, self._name_here(cell, run))
        if msg.get("placed"):
            news.placed(cell.id, **msg["placed"])

    def _name_here(self, cell: C.Cell, run: str) -> str:
        """The run folder's name in this results dir: its own when its node wrote it here, else a folder made
        here for what the node sends (suffixed when another cell's has that name)."""
        with self.names_lock:
            key = (cell.id, run)
            if key not in self.names:
                if self.in_place.get(cell.id):
                    self.names[key] = run
                else:
                    self.runner.runs_root.mkdir(parents=True, exist_ok=True)
                    self.names[key] = unique_dir(self.runner.runs_root, run).name
            return self.names[key]

    def _mark_unfinished(self, cell_id: str, reason: str) -> None:
        """A run folder the node never closed (its copy here still says running) says why it stops there."""
        for run in self.runner.folder.cell(cell_id).get("runs") or []:
            folder = RunFolder.open(self.runner.runs_root / run)
            if folder is not None:
                folder.finish("failed", reason)


def run_on_ray(cfg: Config, camp: Campaign, opts: RunOptions, address: str,
               reporter: Optional[CampaignReporter] = None):  # type: ignore[no-untyped-def]
    from servedeck.cluster.connect import connected

    with connected(address):
        return Runner(cfg, camp, opts, reporter, place=RayPlacement()).run()
