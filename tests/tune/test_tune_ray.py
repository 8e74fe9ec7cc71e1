"""`servedeck tune FILE --ray ADDRESS` on a real Ray cluster on this machine: a head and two worker nodes started
as tests/cluster/test_ray_campaign.py starts them (Ray's own `ray.cluster_utils.Cluster`; each worker one CPU, its
own SERVEDECK_HOME and results dir, the head no CPU for tasks), real llama.cpp serving SmolLM2-135M. The tune is
run by the CLI, as a user runs it, with no `parallel` given: the cluster holds two one-CPU trials at once, so the
starter runs first (alone), then t1 and t2 side by side, each a campaign cell placed by Ray (RayPlacement), each on
its own port (campaign.port_offset). Once both are on their nodes the tune is interrupted (SIGINT to its process
group, as Ctrl-C): both trials are recorded interrupted and no engine is left on either node. `--resume` redoes
both (t3 and t4, the same values, side by side again), then verifies the best one against the starter, one launch
at a time. Asserted from tune.json: t3 and t4 have a verdict, ran on different Ray nodes, and their cells' run
intervals overlapped; the verification's launches did not; afterwards no engine and no Ray process of this cluster
is left.

Kept nearly as short as test_tune_llamacpp.py's tune (a one-probe needle at 512 tokens, 64-token prompts, 8-token
answers, max = 2, one 4-token output-check prompt), but each capacity step lasts 8 s rather than two requests: the
Ctrl-C is sent once an engine is up on each node, and with two-request steps a trial whose engine came up first
could finish its whole cell (about 5 s) before the other's engine was up, so the Ctrl-C found it done (a fresh-clone
CI run, 2026-12-07). With 8-s steps a cell's capacity search alone lasts 24 s or more after its gate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.cluster.test_ray_campaign import _shims_of_nodes, node_env
from tests.campaign_matrix.test_matrix_llamacpp import cli, env_for, llama_ready, models_toml  # noqa: F401
from tests.conftest import stop_everything

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp, pytest.mark.timeout(2700)]
ray = pytest.importorskip("ray", reason="servedeck[ray] is installed by scripts/setup.sh")

TUNE = """
[campaign]
name = "raytune"
model = "smollm2"
cell_timeout = "20m"
gate = { context = 512, depths = [0.5], repeats = 1, threshold = 0 }
reference_prompts = 1
reference_tokens = 4

[slo.chat]
ttft_p50 = "10m"
error_rate = "0%"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["chat"]
input_tokens = 64
output_tokens = 8
duration = "8s"
warmup = 0
max = 2

[search]
trials = 2
seed = 3
verify = { top = 1, repeats = 2 }
require = ["args.ubatch-size <= args.batch-size"]

[search.space]
"args.parallel" = [1, 2]
"args.batch-size" = { low = 64, high = 512, log = true }
"args.ubatch-size" = { low = 32, high = 256, log = true }
"""


def _left_under(root: Path) -> list[str]:
    """Processes started for this cluster (Ray's raylets and workers, engines, shims): each has its node's
    SERVEDECK_HOME under root in its environment."""
    out = []
    for p in psutil.process_iter(["cmdline", "pid"]):
        try:
            if p.environ().get("SERVEDECK_HOME", "").startswith(str(root)):
                out.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
        except (psutil.Error, OSError):
            continue
    return out


def _engine_homes(root: Path) -> set[str]:
    """The worker nodes (a, b) with an engine's shim running under their SERVEDECK_HOME."""
    homes = set()
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "servedeck.supervisor.shim" in " ".join(p.info["cmdline"] or []):
                home = Path(p.environ().get("SERVEDECK_HOME", "/"))
                if home.parent.parent == root:
                    homes.add(home.parent.name)
        except (psutil.Error, OSError):
            continue
    return homes


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, llama_ready):  # noqa: F811
    from ray.cluster_utils import Cluster

    from servedeck.init import default_locations

    root = tmp_path_factory.mktemp("raytune")
    llama_dir = str(Path(default_locations()["llama_server"]).parent)
    t0 = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "env_vars": node_env(root, "head-node", llama_dir)})
    nodes = {n: c.add_node(num_cpus=1, resources={f"host_{n}": 1}, env_vars=node_env(root, n, llama_dir))
             for n in ("a", "b")}
    c.wait_for_nodes()
    print(f"\nRay cluster (head + 2 worker nodes) up in {time.monotonic() - t0:.1f} s at {c.address}")
    cfg = models_toml(root)
    home, results = root / "head" / "home", root / "head" / "results"
    home.mkdir(parents=True)
    (root / "search.toml").write_text(TUNE)
    env = env_for(home, results)
    shut = False
    try:
        t1 = time.monotonic()
        first = subprocess.Popen([sys.executable, "-m", "servedeck", "--config", str(cfg), "tune",
                                  str(root / "search.toml"), "--ray", c.address], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline, placed = time.monotonic() + 900, {}
        while time.monotonic() < deadline and first.poll() is None and len(placed) < 2:
            for f in (results / "campaigns").glob("raytune.t*__*/campaign.json") if (results / "campaigns").exists() else []:
                try:
                    cell = json.loads(f.read_text())["cells"][0]
                except (ValueError, KeyError, IndexError):
                    continue
                if cell.get("ray_node_id") and cell.get("state") == "running":
                    placed[f.parent.name] = cell["ray_node_id"]
            time.sleep(0.2)
        assert first.poll() is None and len(placed) == 2, f"not both placed: {placed}\n" + first.communicate()[1][-3000:]
        # then as soon as an engine is up on each node: a fixed pause after both were seen placed (3 s) once let t2
        # finish its capacity search before the Ctrl-C reached its node; the 8-s steps keep each cell running for 24 s
        # or more after its engine is up, longer than one node's engine has been seen to lag the other's
        while time.monotonic() < deadline and first.poll() is None and _engine_homes(root) < {"a", "b"}:
            time.sleep(0.1)
        assert first.poll() is None and _engine_homes(root) >= {"a", "b"}, first.communicate()[1][-3000:]
        os.killpg(first.pid, signal.SIGINT)
        _out, first_err = first.communicate(timeout=600)
        first_s = time.monotonic() - t1
        interrupted = json.loads(next((results / "tunes").glob("raytune__*/tune.json")).read_text())
        shims_between = _shims_of_nodes(root)
        t2 = time.monotonic()
        r = cli(cfg, env, "tune", str(root / "search.toml"), "--ray", c.address, "--resume", "--json", timeout=2400)
        wall = time.monotonic() - t2
        print(f"servedeck tune --ray: interrupted (rc {first.returncode}) after {first_s:.0f} s; "
              f"--resume: rc {r.returncode} in {wall:.0f} s\n{first_err[-2000:]}\n{r.stderr[-4000:]}")
        c.shutdown()
        shut = True
        for n in ("a", "b", "head-node"):
            stop_everything(root / n / "home")
        stop_everything(home)
        time.sleep(3)
        yield {"r": r, "wall": wall, "first_s": first_s, "first_rc": first.returncode, "first_err": first_err,
               "interrupted": interrupted, "shims_between": shims_between, "placed": placed,
               "nodes": {n: x.node_id for n, x in nodes.items()}, "root": root,
               "results": results, "left": _left_under(root), "shims": _shims_of_nodes(root)}
    finally:
        if not shut:
            c.shutdown()
            for n in ("a", "b", "head-node"):
                stop_everything(root / n / "home")
            stop_everything(home)


def _t(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def test_ctrl_c_stops_both_trials_on_their_nodes(tuned):
    assert tuned["first_rc"] == 130, tuned["first_err"][-3000:]
    trials = {t["trial"]: t for t in tuned["interrupted"]["trials"]}
    assert trials["starter"]["state"] == "done"
    assert trials["t1"]["state"] == trials["t2"]["state"] == "interrupted", trials
    assert all("servedeck tune FILE --ray … --resume" in trials[n]["why"] for n in ("t1", "t2")), trials
    assert len(set(tuned["placed"].values())) == 2  # they were on two nodes when Ctrl-C came
    assert tuned["shims_between"] == []  # no engine left on either node


def test_two_trials_ran_at_once_on_two_ray_nodes(tuned):
    r = tuned["r"]
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads(r.stdout)
    assert doc["finished"] and doc["ray"]["parallel"] == 2  # what two one-CPU workers hold: no parallel given
    assert doc["ray"]["shared_hosts"]  # two nodes on this machine: said
    trials = {t["trial"]: t for t in doc["trials"]}
    assert set(trials) == {"starter", "t1", "t2", "t3", "t4"}
    assert trials["t1"]["redone"] and trials["t2"]["redone"]
    assert sorted(trials[n]["redoes"] for n in ("t3", "t4")) == ["t1", "t2"]
    for n in ("t3", "t4"):
        assert trials[n]["values"] == trials[trials[n]["redoes"]]["values"]
    for t in (trials["starter"], trials["t3"], trials["t4"]):
        assert t["state"] == "done" and t["verdict"], t
        assert t["placed"] == "ray" and t["ray_node_id"] in tuned["nodes"].values(), t
    t1, t2, st = trials["t3"], trials["t4"], trials["starter"]
    assert t1["ray_node_id"] != t2["ray_node_id"]  # one on each worker node
    assert t1["port"] != t2["port"]  # side by side on one host: their own ports
    # the starter first, alone; then t1 and t2's cells overlapped
    assert _t(st["ended"]) <= min(_t(t1["started"]), _t(t2["started"]))
    start, end = max(_t(t1["cell_started"]), _t(t2["cell_started"])), min(_t(t1["cell_ended"]), _t(t2["cell_ended"]))
    overlap = (end - start).total_seconds()
    assert overlap > 0, (t1, t2)
    # the figures docs/tune.md quotes
    print(f"\nwall {tuned['wall']:.0f} s; starter {st['duration_s']} s on {st['ray_node_id'][:12]}; "
          + "; ".join(f"{n} {t['values']} {t['verdict']} {t.get('value')} on {t['ray_node_id'][:12]} port {t['port']} "
                      f"cell {t['cell_started']} → {t['cell_ended']} ({t['duration_s']} s)" for n, t in
                      (("t3", t1), ("t4", t2)))
          + f"; overlap {overlap:.0f} s; first session {tuned['first_s']:.0f} s")
    md = next((tuned["results"] / "tunes").glob("raytune__*/tune.md")).read_text()
    assert "## Where each trial ran" in md and "at most 2 trial(s) ran at the same time" in md


def test_the_verification_ran_one_launch_at_a_time_on_ray(tuned):
    doc = json.loads(tuned["r"].stdout)
    ver = doc["verification"]
    assert ver["state"] == "done" and len(ver["candidates"]) == 1 and ver["repeats"] == 2, ver
    [best] = ver["candidates"]
    assert ver["order"] == ["starter#1", f"{best}#1", "starter#2", f"{best}#2"]
    camp = json.loads(next((tuned["results"] / "campaigns").glob("raytune.verify__*"))
                      .joinpath("campaign.json").read_text())
    cells = sorted(camp["cells"], key=lambda c: c["started"])
    assert [c["id"] for c in cells] == ver["order"]
    assert all(c["state"] == "done" and c["ray_node_id"] in tuned["nodes"].values() for c in cells), cells
    for a, b in zip(cells, cells[1:]):
        assert _t(a["ended"]) <= _t(b["started"]), (a["id"], b["id"])  # none beside another
    assert ver["verdict"] in ("verified", "not held", "undecided", "no baseline")
    print(f"\nverification: {ver['verdict']}: {ver['why']}; "
          + ", ".join(f"{c['id']} {c['started']}→{c['ended']} on {c['ray_node_id'][:12]}" for c in cells))


def test_nothing_is_left_running(tuned):
    assert tuned["shims"] == []
    assert tuned["left"] == []
