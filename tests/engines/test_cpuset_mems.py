"""Issue 31 item 9: a container's memory nodes. `--cpuset-mems` came from the NUMA nodes of the host that
rendered the launch, so a replica whose CPUs are on a node this host lacks got none, and seed 000's own
`--cpuset-cpus 0-23,96-119,24-47,120-143 --cpuset-mems 0,1` could not be written. Now `cpus` carries its
memory nodes (`cpus = { set = ..., mems = ... }`, per replica too), and `campaign plan --inventory` renders
against the inventory host's NUMA nodes. Argv only: docker cannot run here, so no container starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.engines import get_engine
from servedeck.errors import ConfigError
from servedeck.modelsfile import parse

SEED = "--cpuset-cpus 0-23,96-119,24-47,120-143 --cpuset-mems 0,1"  # seed 000's cmd.sh, as it wrote it

MODELS = """
[builds.img]
engine = "vllm"
image = "vllm/vllm-openai:v0.31.0"

[builds.venv]
engine = "vllm"
python = "/opt/vllm/bin/python"

[models.qwen38_27b]
source = "/mnt/data/models/Qwen__Qwen3.8-27B-FP8"
build = "img"
port = 8000
gpus = [0, 1, 2, 3]
dp = 4
{cpus}
"""


def _argv(cpus: str, name: str = "qwen38_27b") -> list[str]:
    cfg = parse(MODELS.format(cpus=cpus), Path("/x/models.toml"))
    return get_engine("vllm").render(name, cfg).argv


def _flags(argv: list[str]) -> str:
    """The cpuset flags as the seed writes them (flag, space, value)."""
    return " ".join(a.replace("=", " ", 1) for a in argv if a.startswith("--cpuset-"))


def test_seed_000s_cpus_and_memory_nodes_render_as_its_cmd_sh():
    assert _flags(_argv('cpus = { set = "0-23,96-119,24-47,120-143", mems = "0,1" }')) == SEED
    assert _flags(_argv('cpus = { set = "0-23,96-119,24-47,120-143", mems = [0, 1] }')) == SEED


def test_each_replica_gets_its_own_memory_nodes():
    text = MODELS.format(cpus='replicas = 2\ncpus = [{ set = "0-23", mems = [0] }, { set = "24-47", mems = [1] }]')
    text = text.replace("gpus = [0, 1, 2, 3]\ndp = 4", "gpus = [[0], [1]]")
    cfg = parse(text, Path("/x/models.toml"))
    flags = [_flags(get_engine("vllm").render(m, cfg).argv) for m in cfg.members("qwen38_27b")]
    assert flags == ["--cpuset-cpus 0-23 --cpuset-mems 0", "--cpuset-cpus 24-47 --cpuset-mems 1"]


def test_a_cpulist_string_is_the_same_as_the_list():
    assert _flags(_argv('cpus = "0-3"')).startswith("--cpuset-cpus 0-3")
    cfg = parse(MODELS.format(cpus='cpus = "0-3,8"'), Path("/x/models.toml"))
    assert cfg.models["qwen38_27b"].cpus == [0, 1, 2, 3, 8]


@pytest.mark.parametrize("cpus, problem", [
    ('cpus = { mems = [0] }', "a table takes set"),
    ('cpus = { set = "0-3", mem = [0] }', "a table takes set"),
    ('cpus = { set = "3-1" }', "is not a list like"),
    ('cpus = { set = "0-3", mems = [-1] }', "NUMA node numbers >= 0"),
])
def test_a_wrong_cpus_table_is_refused_by_key(cpus, problem):
    with pytest.raises(ConfigError) as e:
        _argv(cpus)
    assert "models.qwen38_27b" in e.value.message and problem in e.value.message, e.value.message


def test_memory_nodes_on_a_process_build_are_refused():
    text = MODELS.format(cpus='cpus = { set = "0-1", mems = [0] }').replace('build = "img"', 'build = "venv"')
    with pytest.raises(ConfigError) as e:
        parse(text, Path("/x/models.toml"))
    assert "models.qwen38_27b.cpus: memory nodes (mems) are given to a container" in e.value.message


CAMPAIGN = """
[campaign]
name = "numa-arms"
model = "qwen38_27b"

[[variants]]
name = "arm0"
cpus = [0, 1, 2, 3]

[[variants]]
name = "arm1"
cpus = [4, 5, 6, 7]

[[variants]]
name = "pinned"
cpus = { set = "4-7", mems = [0] }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 64
output_tokens = 8
requests = 2
"""


def test_campaign_plan_renders_memory_nodes_from_the_inventorys_topology(tmp_path):
    """The plan is for a two-node host (CPUs 0-3 on node 0, 4-7 on node 1); this box has one node."""
    (tmp_path / "models.toml").write_text(MODELS.format(cpus="").replace("gpus = [0, 1, 2, 3]\ndp = 4", ""))
    (tmp_path / "camp.toml").write_text(CAMPAIGN)
    # what `servedeck gpu --json` saves on that host (no GPU readable here: the plan is about CPUs)
    (tmp_path / "inv.json").write_text(json.dumps({"available": False, "reason": "saved on the GPU host", "gpus": [],
                                                   "numa": {"0": "0-3", "1": "4-7"}}))
    res = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(tmp_path / "models.toml"), "campaign",
                          "plan", str(tmp_path / "camp.toml"), "--inventory", str(tmp_path / "inv.json"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    v = json.loads(res.stdout)["variants"]
    flags = {name: _flags(v[name]["replicas"][0]["argv"]) for name in ("arm0", "arm1", "pinned")}
    assert flags == {"arm0": "--cpuset-cpus 0-3 --cpuset-mems 0", "arm1": "--cpuset-cpus 4-7 --cpuset-mems 1",
                     "pinned": "--cpuset-cpus 4-7 --cpuset-mems 0"}  # the variant's own mems win


def test_an_inventory_keeps_the_hosts_numa_nodes():
    from servedeck.gpu import Inventory

    inv = Inventory(False, reason="no GPU", numa={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]})
    assert inv.to_json()["numa"] == {"0": "0-3", "1": "4-7"}
    assert Inventory.from_json(json.loads(json.dumps(inv.to_json()))).numa == inv.numa


def test_cpus_the_inventorys_host_lacks_are_said_in_the_plan(tmp_path):
    from servedeck.gpu import Inventory

    (tmp_path / "models.toml").write_text(MODELS.format(cpus="").replace("gpus = [0, 1, 2, 3]\ndp = 4", ""))
    (tmp_path / "camp.toml").write_text(CAMPAIGN)
    (tmp_path / "inv.json").write_text(json.dumps(Inventory(False, numa={0: [0, 1, 2, 3]}).to_json()))
    res = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(tmp_path / "models.toml"), "campaign",
                          "plan", str(tmp_path / "camp.toml"), "--inventory", str(tmp_path / "inv.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "qwen38_27b@arm1: CPUs [4, 5, 6, 7] are on no NUMA node of the inventory's host" in res.stdout, res.stdout
