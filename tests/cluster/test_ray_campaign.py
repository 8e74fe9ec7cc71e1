"""Campaigns on a real Ray cluster: a head and two worker nodes started on this machine with Ray's own
`ray.cluster_utils.Cluster` (what Ray's tests use for several nodes on one host). Each worker node has
one CPU, a custom resource (`host_a` / `host_b`) and its own SERVEDECK_HOME and results dir, so each
behaves as a separate host would: its own deck state, its own run folders. The head has no CPU for
tasks, so every cell runs on a worker node. The campaign is run by the CLI, as a user runs it:
`servedeck campaign run FILE --ray ADDRESS`, with real llama.cpp serving SmolLM2-135M. One campaign
gives the head node a's results dir, as one host (`--ray local`) shares it between head and node.

Order matters: the last test kills a worker node."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.conftest import SESSION, TEST_MARK, stop_everything
from tests.campaign_matrix.test_matrix_llamacpp import cli, env_for, llama_ready, models_toml, start  # noqa: F401

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp, pytest.mark.timeout(600)]
ray = pytest.importorskip("ray", reason="servedeck[ray] is installed by scripts/setup.sh")

GATE_AND_CHAT = """
gate = { context = 600, depths = [0.5] }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 48
output_tokens = OUT
requests = REQ
warmup = 0
"""


def campaign(name: str, variants: str, out: int = 8, req: int = 3) -> str:
    head, _, work = GATE_AND_CHAT.partition("\n\n")
    return (f'[campaign]\nname = "{name}"\nmodel = "smollm2"\ncell_timeout = "4m"\n{head.strip()}\n\n{variants}\n\n'
            + work.replace("OUT", str(out)).replace("REQ", str(req)))


PINNED = """
[[variants]]
name = "a"
host = "host_a"
args = { parallel = 1, threads = 1 }

[[variants]]
name = "b"
host = "host_b"
args = { parallel = 1, threads = 1 }
gpus = [1]
"""

# the issue-20 campaign (two variants differing in `parallel`), one cell on each node
SHARED = """
[[variants]]
name = "p1"
host = "host_a"
args = { parallel = 1, threads = 1 }

[[variants]]
name = "p2"
host = "host_b"
args = { parallel = 2, threads = 1 }
"""

UNPINNED = """
[[variants]]
name = "u"
args = { parallel = 1, threads = 1 }
"""


def node_env(root: Path, name: str, llama_dir: str) -> dict[str, str]:
    return {"SERVEDECK_HOME": str(root / name / "home"), "SERVEDECK_RESULTS": str(root / name / "results"),
            TEST_MARK: SESSION, "SD_TEST_LLAMA_DIR": llama_dir}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, llama_ready):  # noqa: F811
    from ray.cluster_utils import Cluster

    from servedeck.init import default_locations

    root = tmp_path_factory.mktemp("ray")
    llama_dir = str(Path(default_locations()["llama_server"]).parent)
    t0 = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "env_vars": node_env(root, "head-node", llama_dir)})
    nodes = {"a": c.add_node(num_cpus=1, resources={"host_a": 1}, env_vars=node_env(root, "a", llama_dir)),
             # node b's environment points the build at a folder that does not exist (the preflight test)
             # node b offers two GPUs to Ray (logical ones: this machine has none; Ray hands them out and
             # sets CUDA_VISIBLE_DEVICES all the same, which is the path under test)
             "b": c.add_node(num_cpus=1, num_gpus=2, resources={"host_b": 1}, env_vars=node_env(root, "b", llama_dir) |
                             {"SD_TEST_LLAMA_DIR": str(root / "no-llama-here")})}
    c.wait_for_nodes()
    print(f"\nRay cluster (head + 2 worker nodes) up in {time.monotonic() - t0:.1f} s at {c.address}")
    cfg = models_toml(root)
    home, results = root / "head" / "home", root / "head" / "results"
    home.mkdir(parents=True)
    try:
        yield {"cluster": c, "address": c.address, "nodes": nodes, "root": root, "cfg": cfg,
               "env": env_for(home, results), "results": results}
    finally:
        c.shutdown()
        for n in ("a", "b"):
            stop_everything(root / n / "home")


def _doc(results: Path, name: str) -> dict:
    folder = sorted((results / "campaigns").glob(f"{name}__*"))[-1]
    return json.loads((folder / "campaign.json").read_text())


def _write(cluster: dict, name: str, text: str) -> Path:
    path = cluster["root"] / f"{name}.toml"
    path.write_text(text)
    return path


def _shims_of_nodes(root: Path) -> list[int]:
    """Engines (their shims) started under any node's home: none may outlive a cell."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "servedeck.supervisor.shim" in " ".join(p.info["cmdline"] or []) and \
                    p.environ().get("SERVEDECK_HOME", "").startswith(str(root)):
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def test_the_node_s_stop_after_a_ctrl_c_settles_an_engine_the_cancelled_task_killed(tmp_path, llama_ready,  # noqa: F811
                                                                                        monkeypatch):
    """What a node does after the head's Ctrl-C, without Ray: the cancelled task killed the cell's engine
    (lockless, as CellHere.stop does) and its worker went with the head before its own stop settled the
    record. The stop task the head waits for must leave this node's deck with nothing live and nothing
    wanted. Before, it stopped only engines it found alive and left the dead record (fresh-clone run at ee790d4)."""
    from servedeck.campaign import cells as C
    from servedeck.campaign.file import parse as parse_campaign
    from servedeck.cluster import node as N
    from servedeck.deck import Deck
    from servedeck.deck import state as S
    from servedeck.modelsfile import parse as parse_models

    cfg_path = models_toml(tmp_path)
    camp_path = tmp_path / "stop.toml"
    camp_path.write_text(campaign("t-stop", UNPINNED))
    camp = parse_campaign(camp_path.read_text(), camp_path)
    derived = C.derive(parse_models(cfg_path.read_text(), str(cfg_path)), camp)
    [cell] = C.cell_list(camp, derived)
    [name] = cell.models
    deck = Deck(derived.cfg)
    rec = deck.start(name, reason="campaign t-stop").record
    assert deck.kill(cell.models, reason="campaign t-stop: interrupted (Ctrl-C)") == [name]
    assert S.read_live(name) is not None  # dead, and its own stop never came
    monkeypatch.setattr(N, "identity", lambda: {"host": "here", "ray_node_id": None})
    got = N.stop_cell({"models_toml": cfg_path.read_text(), "models_path": str(cfg_path),
                       "campaign_toml": camp_path.read_text(), "campaign_path": str(camp_path), "cell": cell.id})
    assert got["stopped"] == []  # already stopped: settled, not stopped again
    assert S.read_live(name) is None
    assert name not in S.read_desired()["models"]
    assert not [r for r in S.read_journal(name) if r["event"] == "crash"]
    assert json.loads((Path(rec.launch_dir) / "launch.json").read_text())["state"] == "stopped"


def test_hosts_lists_every_node_with_its_doctor_verdict(cluster):
    # the build path is $SD_TEST_LLAMA_DIR/llama-server: right on node a and the head, missing on node b
    text = cluster["cfg"].read_text()
    binary = str(Path(text.split('binary = "', 1)[1].split('"', 1)[0]))
    envcfg = cluster["root"] / "envbuild.toml"
    envcfg.write_text(text.replace(binary, "$SD_TEST_LLAMA_DIR/llama-server"))
    r = cli(envcfg, cluster["env"], "hosts", "--ray", cluster["address"], "--model", "smollm2", "--json")
    assert r.returncode == 1, r.stderr  # node b fails its doctor: the command says so in its exit code
    nodes = json.loads(r.stdout)["nodes"]
    assert len(nodes) == 3 and sum(n["head"] for n in nodes) == 1
    by_res = {tuple(n["resources"]): n for n in nodes}
    a, b = by_res[("host_a",)], by_res[("host_b",)]
    assert a["ray_node_id"] == cluster["nodes"]["a"].node_id and b["ray_node_id"] == cluster["nodes"]["b"].node_id
    assert a["doctor"] == "OK" and a["servedeck"] and a["cpus"] >= 1 and a["ray_cpus"] == 1
    assert b["doctor"] == "FAIL"
    assert any(x["check"] == "build" and x["status"] == "FAIL" and "no-llama-here" in x["saw"] for x in b["rows"])
    # and a campaign that could land on node b is refused before anything starts, naming node and build
    camp = _write(cluster, "refused", campaign("t-refused", PINNED))
    r = cli(envcfg, cluster["env"], "campaign", "run", str(camp), "--ray", cluster["address"])
    assert r.returncode == 5, r.stderr  # RefusedError
    err = " ".join(r.stderr.split())
    assert "campaign refused before anything started" in err and "build llamacpp" in err and "no-llama-here" in err
    assert "Traceback" not in r.stderr
    assert not list((cluster["root"] / "a" / "results").glob("runs/*")), "nothing may start on a refusal"


def test_a_variant_asking_for_a_host_no_node_has_is_refused(cluster):
    camp = _write(cluster, "nohost", campaign("t-nohost", PINNED.replace("host_b", "quad-z")))
    r = cli(cluster["cfg"], cluster["env"], "campaign", "run", str(camp), "--ray", cluster["address"])
    err = " ".join(r.stderr.split())
    assert r.returncode == 5 and "variants.b.host = 'quad-z': no alive node offers it" in err, r.stderr
    assert "host_a" in err and "host_b" in err  # what the nodes do offer


def test_two_nodes_run_their_cells_at_once_and_the_folders_come_back(cluster):
    camp = _write(cluster, "two", campaign("t-two", PINNED))
    t0 = time.monotonic()
    r = cli(cluster["cfg"], cluster["env"], "campaign", "run", str(camp), "--ray", cluster["address"], "--json")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    doc = _doc(cluster["results"], "t-two")
    cells = {c["id"]: c for c in doc["cells"]}
    assert {k: c["state"] for k, c in cells.items()} == {"a#1": "done", "b#1": "done"}
    assert cells["a#1"]["ray_node_id"] == cluster["nodes"]["a"].node_id
    assert cells["b#1"]["ray_node_id"] == cluster["nodes"]["b"].node_id
    assert all(c["node"] == os.uname().nodename for c in cells.values())
    # GPUs: b names position 1, so it asked Ray for two; Ray granted physical 0 and 1 and the engine was
    # given the second (CUDA_VISIBLE_DEVICES=1); a named none and got none
    assert cells["b#1"]["node_gpus"] == [0, 1] and cells["a#1"]["node_gpus"] is None
    cmd_b = (cluster["results"] / "runs" / cells["b#1"]["runs"][0] / "cmd.sh").read_text()
    cmd_a = (cluster["results"] / "runs" / cells["a#1"]["runs"][0] / "cmd.sh").read_text()
    assert "CUDA_VISIBLE_DEVICES=1" in cmd_b and "CUDA_VISIBLE_DEVICES" not in cmd_a, cmd_b
    # at the same time: each started before the other ended
    t = {k: (datetime.fromisoformat(c["started"]), datetime.fromisoformat(c["ended"])) for k, c in cells.items()}
    assert t["a#1"][0] < t["b#1"][1] and t["b#1"][0] < t["a#1"][1], t
    runs = cluster["results"] / "runs"
    for cid, c in cells.items():
        node = cid[0]
        assert len(c["runs"]) == 2  # gate, chat
        for name in c["runs"]:
            here, there = runs / name, cluster["root"] / node / "results" / "runs" / name
            summary = json.loads((here / "summary.json").read_text())
            assert summary["status"] == "ok" and summary["node"]["ray_node_id"] == c["ray_node_id"]
            assert summary["campaign"]["cell"] == cid
            # every file the node wrote came back, byte for byte
            files = sorted(p.relative_to(there) for p in there.rglob("*") if p.is_file())
            assert files == sorted(p.relative_to(here) for p in here.rglob("*") if p.is_file())
            assert all((here / f).read_bytes() == (there / f).read_bytes() for f in files)
        bench = json.loads((runs / c["runs"][1] / "requests.jsonl").read_text().splitlines()[0])
        assert bench["status"] == "ok" and bench["output_tokens"] == 8
    # the preflight asked every node (head included) and campaign.json keeps what each said
    head_id = cluster["cluster"].head_node.node_id
    assert {n["ray_node_id"] for n in doc["cluster"]["nodes"]} == {n.node_id for n in cluster["nodes"].values()} | {head_id}
    assert all(n["doctor"] == "OK" for n in doc["cluster"]["nodes"])
    md = (sorted((cluster["results"] / "campaigns").glob("t-two__*"))[-1] / "campaign.md").read_text()
    assert "| a | chat | c=1 |" in md and "| b | chat | c=1 |" in md
    assert not _shims_of_nodes(cluster["root"])
    print(f"\ntwo cells on two Ray nodes: {took:.1f} s for the whole `campaign run --ray` (CLI start to exit)")


def test_a_node_sharing_the_heads_results_dir_leaves_one_campaign_folder_and_one_folder_per_run(cluster):
    """As on one host (`--ray local`): the head's results dir is node a's own; node b's is elsewhere."""
    shared = cluster["root"] / "a" / "results"
    env = cluster["env"] | {"SERVEDECK_RESULTS": str(shared)}
    runs_before = set(os.listdir(shared / "runs")) if (shared / "runs").exists() else set()
    camp = _write(cluster, "shared", campaign("t-shared", SHARED))
    r = cli(cluster["cfg"], env, "campaign", "run", str(camp), "--ray", cluster["address"])
    assert r.returncode == 0, r.stderr[-3000:]
    folders = sorted((shared / "campaigns").glob("t-shared__*"))
    assert len(folders) == 1, [f.name for f in folders]  # the head's: no node writes one beside it
    doc = json.loads((folders[0] / "campaign.json").read_text())
    assert {c["id"]: c["state"] for c in doc["cells"]} == {"p1#1": "done", "p2#1": "done"}
    listed = [run for c in doc["cells"] for run in c["runs"]]
    assert len(listed) == 4  # each cell: its gate and its chat run
    # one folder per gate and workload: node a's were written here once, node b's sent here once
    assert sorted(set(os.listdir(shared / "runs")) - runs_before) == sorted(listed)
    # node b, whose results dir is its own, keeps its run folders there but no campaign folder
    assert not list((cluster["root"] / "b" / "results" / "campaigns").glob("t-shared__*"))
    # every run names the head's campaign folder, and `servedeck runs` lists each once
    assert {json.loads((shared / "runs" / n / "summary.json").read_text())["campaign"]["folder"]
            for n in listed} == {folders[0].name}
    rows = json.loads(cli(cluster["cfg"], env, "runs", "--campaign", "t-shared", "--json").stdout)
    assert sorted(row["run"] for row in rows) == sorted(listed)


def test_ray_local_starts_its_own_cluster_even_with_another_one_named_in_ray_address(cluster):
    # Ray's own ray.init() (no address) joins the cluster in RAY_ADDRESS or the last `ray start` here
    env = cluster["env"] | {"RAY_ADDRESS": cluster["address"]}
    r = cli(cluster["cfg"], env, "hosts", "--ray", "local", "--model", "smollm2", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    nodes = json.loads(r.stdout)["nodes"]
    assert len(nodes) == 1, [n["ray_node_id"] for n in nodes]  # this machine, one node: not the test's three
    assert nodes[0]["ray_node_id"] not in {n.node_id for n in cluster["nodes"].values()}


def _wait_for(cluster: dict, name: str, pred, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    doc: dict = {}
    while time.monotonic() < deadline:
        try:
            doc = _doc(cluster["results"], name)
            if pred(doc):
                return doc
        except (IndexError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"campaign {name} never reached the expected state: "
                         f"{[(c['id'], c['state'], c['runs']) for c in doc.get('cells', [])]}")


def _measuring(doc: dict) -> bool:
    """Every cell still running, with its gate and its workload's run folder listed: each is mid-measurement."""
    return all(c.get("ray_node_id") and c["state"] == "running" and len(c.get("runs") or []) >= 2
               for c in doc["cells"])


def _one_measuring_none_ended(doc: dict) -> bool:
    """Every cell placed on its node and still running, one of them mid-measurement: a Ctrl-C now lands on
    an engine being measured on one node and one booting, gating or measuring on the other. Waiting for
    both to measure raced: on a loaded machine node a's cell ended before node b's began its workload."""
    cells = doc["cells"]
    return (all(c.get("ray_node_id") and c["state"] == "running" for c in cells)
            and any(len(c.get("runs") or []) >= 2 for c in cells))


def test_ctrl_c_on_the_head_leaves_no_engine_on_any_node(cluster):
    camp = _write(cluster, "ctrlc", campaign("t-ctrlc", PINNED, out=48, req=20))
    proc = start(cluster["cfg"], cluster["env"], "campaign", "run", str(camp), "--ray", cluster["address"])
    try:
        at = _wait_for(cluster, "t-ctrlc", _one_measuring_none_ended)
        proc.send_signal(signal.SIGINT)
        print("\nCtrl-C with the cells at", [(c["id"], c["state"], len(c["runs"])) for c in at["cells"]])
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    doc = _doc(cluster["results"], "t-ctrlc")
    assert {c["state"] for c in doc["cells"]} == {"pending"}, [(c["id"], c["state"], c["reason"]) for c in doc["cells"]]
    assert not _shims_of_nodes(cluster["root"])
    for n in ("a", "b"):  # and each node's deck agrees: nothing live, nothing wanted, and no crash recorded
        home = cluster["root"] / n / "home"
        live = home / "live"
        assert not list(live.glob("*.json")) if live.exists() else True, (n, sorted(live.glob("*.json")))
        desired = home / "desired.json"
        assert not (json.loads(desired.read_text())["models"] if desired.exists() else {}), (n, desired.read_text())
        journal = [json.loads(ln) for ln in (home / "journal.jsonl").read_text().splitlines()]
        assert not [r for r in journal if r["event"] == "crash"], (n, journal)
    for c in doc["cells"]:
        for name in c["runs"]:
            s = json.loads((cluster["results"] / "runs" / name / "summary.json").read_text())
            assert s["status"] in ("ok", "failed") and (s["status"] == "ok" or "interrupted" in s["reason"]), s
    # --resume redoes them (the same frozen campaign) and finishes
    r = cli(cluster["cfg"], cluster["env"], "campaign", "run", str(camp), "--ray", cluster["address"], "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert {c["state"] for c in _doc(cluster["results"], "t-ctrlc")["cells"]} == {"done"}


def test_a_node_lost_mid_cell_is_recorded_and_the_cell_retried_on_the_other_node(cluster):
    camp = _write(cluster, "lost", campaign("t-lost", UNPINNED, out=64, req=8))
    proc = start(cluster["cfg"], cluster["env"], "campaign", "run", str(camp), "--ray", cluster["address"], "--json")
    try:
        doc = _wait_for(cluster, "t-lost", _measuring)
        victim_id = doc["cells"][0]["ray_node_id"]
        victim = next(k for k, n in cluster["nodes"].items() if n.node_id == victim_id)
        cluster["cluster"].remove_node(cluster["nodes"][victim])  # the raylet and its workers die
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    cell = _doc(cluster["results"], "t-lost")["cells"][0]
    first, second = cell["attempts"]
    assert first["ray_node_id"] == victim_id and first["state"] == "failed"
    assert first["reason"].startswith("node lost: ") and victim_id[:12] in first["reason"]
    assert second["state"] == "done" and second["ray_node_id"] != victim_id
    assert cell["state"] == "done" and cell["ray_node_id"] == second["ray_node_id"]
    assert cell["earlier_runs"] == first["runs"] and len(first["runs"]) >= 2
    # the partial run folders are kept: what the node had sent, marked as cut short by the loss
    partial = [json.loads((cluster["results"] / "runs" / r / "summary.json").read_text()) for r in first["runs"]]
    assert partial[0]["status"] == "ok" and partial[0]["kind"] == "gate"
    assert partial[-1]["status"] == "failed" and partial[-1]["reason"].startswith("node lost")
    assert "retrying on another node" in err
    # the engine on the lost node went with its worker (the shim watches its owner)
    deadline = time.monotonic() + 30
    while _shims_of_nodes(cluster["root"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _shims_of_nodes(cluster["root"])
    print("\nnode-loss cell:", json.dumps({k: cell[k] for k in ("id", "state", "node", "ray_node_id", "attempts")},
                                          indent=1))
