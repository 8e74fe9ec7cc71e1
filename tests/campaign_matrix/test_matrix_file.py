"""The campaign file, its [matrix], derived model entries and scheduling: pure, no process started."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.campaign.cells import Cell, cell_list, conflicts, derive, eta_s, holders_in_the_way, next_cells, to_run
from servedeck.campaign.file import expand_matrix, parse
from servedeck.config.load import parse as parse_models
from servedeck.engines import get_engine
from servedeck.errors import ConfigError
from servedeck.init import render_starter

P = Path("/x/camp.toml")

BASE = """
[campaign]
name = "smol"
model = "smol"
cell_timeout = "10m"
repeats = 2
gate = { context = 1024, depths = [0.5] }

[[variants]]
name = "p1"
args = { parallel = 1 }

[[variants]]
name = "2x"
replicas = 2
cpus = [[0], [1]]

[matrix]
"args.batch-size" = [64, 128]

[[workloads]]
kind = "chat"
concurrency = [1, 4]
input_tokens = 64
output_tokens = 8
requests = 4
"""


def cfg():
    return parse_models(render_starter(Path("/cache")), Path("/x/models.toml"))


def test_parse_expands_matrix_and_names_variants():
    camp = parse(BASE, P)
    assert [v.name for v in camp.variants] == ["p1", "2x", "batch-size=64", "batch-size=128"]
    assert camp.knobs["batch-size=64"] == {"args.batch-size": 64}
    assert camp.knobs["2x"] == {"replicas": 2, "cpus": [[0], [1]]}
    assert camp.base_variant == "p1"
    assert camp.head.cell_timeout_s == 600
    assert expand_matrix({"tp": [1, 2], "env.X": ["a"]})[1][:2] == ("tp=2,X=a", {"tp": 2, "env": {"X": "a"}})


@pytest.mark.parametrize("change, expect", [
    ('name = "p1"\nargs', "variants.0.nme: unknown key"),  # typo'd key refused
    ("cell_timeout = \"10m\"", "campaign.cell_timeout: 'soon' is not a duration"),
    ("replicas = 2\ncpus = [[0], [1]]", "variants.1: Value error, cpus: 1 lists given for replicas = 2"),
    ('"args.batch-size"', "matrix: 'port': a matrix key is one of"),
    # every kind of workloads/kinds.py, in its order (ramp and decode joined the campaign file with the registry)
    ('kind = "chat"', "workloads.0.kind: Input should be 'chat', 'long-prompt', 'decode', 'ramp', 'conversations', "
                      "'shared-prefix', 'trace' or 'capacity'"),
])
def test_errors_name_file_key_and_expectation(change, expect):
    bad = {
        'name = "p1"\nargs': 'nme = "p1"\nname = "p1"\nargs',
        "cell_timeout = \"10m\"": "cell_timeout = \"soon\"",
        "replicas = 2\ncpus = [[0], [1]]": "replicas = 2\ncpus = [[0]]",
        '"args.batch-size"': '"port"',
        'kind = "chat"': 'kind = "chatty"',
    }[change]
    with pytest.raises(ConfigError) as e:
        parse(BASE.replace(change, bad, 1), P)
    assert str(P) in e.value.message
    assert expect.replace("Value error, ", "") in e.value.message, e.value.message


def test_duplicate_names_and_missing_workloads_refused():
    text = BASE.replace('name = "2x"', 'name = "p1"').split("[[workloads]]")[0]
    with pytest.raises(ConfigError) as e:
        parse(text, P)
    assert "name 'p1' is used twice" in e.value.message
    assert "workloads: no [[workloads]]" in e.value.message


CAPACITY = """
[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["chat"]
input_tokens = 128
output_tokens = 32
duration = "6s"

[slo.chat]
ttft_p90 = "2s"
"""


def _check_of(camp, k):
    """What workload k of the campaign sends, read as campaign/steps.py reads it (its first spec)."""
    from servedeck.workloads.kinds import KINDS
    from servedeck.workloads.shape import Entry
    head = camp.head
    where = Entry(base=Path("/x"), slos=camp.slos,
                  output_check=(head.reference_prompts, head.reference_tokens) if head.reference and k == 0 else None)
    w = camp.file.workloads[k]
    return KINDS[w.kind].from_entry(w, where)[0]


def test_a_reference_is_answered_whatever_the_first_workload():
    """A campaign naming a `reference` whose first workload cannot answer the output check (a capacity search)
    gets a one-request chat run first that does: once, its table said "not checked" and the recommendation took
    a variant nobody compared. A first workload that can answer it keeps the job, and with no reference nothing
    is added."""
    head = BASE.split("[[workloads]]")[0].replace("repeats = 2", 'repeats = 2\nreference = "p1"\nreference_prompts = 3')
    camp = parse(head + CAPACITY, P)
    assert [w.title for w in camp.file.workloads] == ["output check", "capacity"]
    first = _check_of(camp, 0)
    assert first.check_outputs and first.check_prompts == 3 and first.requests == 1 and first.input_tokens == 64
    with_chat = parse(BASE.replace("repeats = 2", 'repeats = 2\nreference = "p1"') + CAPACITY, P)
    assert [w.title for w in with_chat.file.workloads] == ["chat", "capacity"]
    assert _check_of(with_chat, 0).check_outputs
    without = parse(BASE.split("[[workloads]]")[0] + CAPACITY, P)
    assert [w.title for w in without.file.workloads] == ["capacity"]


def test_derive_makes_one_model_entry_per_replica_on_its_own_port():
    c = cfg()
    d = derive(c, parse(BASE, P))
    assert d.base == "smollm2"
    assert d.models["2x"] == ("smollm2@2x.r1", "smollm2@2x.r2")
    r1, r2 = (d.cfg.models[n] for n in d.models["2x"])
    assert (r1.cpus, r2.cpus) == ([0], [1])
    ports = [d.cfg.models[n].port for names in d.models.values() for n in names]
    assert len(set(ports)) == len(ports) and not set(ports) & {m.port for m in c.models.values()}
    p1 = d.cfg.models["smollm2@p1"]
    assert p1.args["parallel"] == 1 and p1.served_name == "smollm2" and p1.slot == "smollm2@p1"
    argv = get_engine("llamacpp").render("smollm2@batch-size=64", d.cfg).argv
    assert argv[argv.index("--batch-size") + 1] == "64"
    spec = get_engine("llamacpp").render("smollm2@2x.r2", d.cfg)
    assert spec.cpus == [1]


def test_derive_refuses_what_models_toml_would_refuse():
    bad = BASE.replace("replicas = 2", 'build = "nope"\nreplicas = 2')
    with pytest.raises(ConfigError) as e:
        derive(cfg(), parse(bad, P))
    assert "variants.2x" in e.value.message and "build 'nope' does not exist" in e.value.message
    with pytest.raises(ConfigError) as e:
        derive(cfg(), parse(BASE.replace("args = { parallel = 1 }", 'args = { port = 9 }'), P))
    assert "variants.p1 (its entry smollm2@p1.args.port: servedeck renders this flag" in e.value.message


def test_cells_round_robin_repeats_and_sets():
    d = derive(cfg(), parse(BASE, P))
    cells = cell_list(parse(BASE, P), d)
    assert [c.id for c in cells[:5]] == ["p1#1", "2x#1", "batch-size=64#1", "batch-size=128#1", "p1#2"]
    assert cells[1].cpus == frozenset({0, 1}) and not cells[0].pinned


def test_scheduling_parallel_only_on_disjoint_sets():
    a = Cell("a#1", "a", 1, ("m@a",), cpus=frozenset({0}))
    b = Cell("b#1", "b", 1, ("m@b",), cpus=frozenset({1}))
    c = Cell("c#1", "c", 1, ("m@c",), cpus=frozenset({0, 1}))
    free = Cell("f#1", "f", 1, ("m@f",))
    g0 = Cell("g#1", "g", 1, ("m@g",), gpus=frozenset({0}))
    assert next_cells([a, b, c], [], parallel=False) == [a]
    assert next_cells([a, b, c], [a], parallel=False) == []
    assert next_cells([a, b, c], [], parallel=True) == [a, b]
    assert next_cells([c, a], [b], parallel=True) == [a]
    assert next_cells([free, a], [], parallel=True) == [free]  # unpinned: alone
    assert next_cells([a], [free], parallel=True) == []
    assert not conflicts(g0, a) and conflicts(a, c)


def test_resume_decisions_and_holders_and_eta():
    assert to_run("running", "a", None, False) and to_run("pending", "a", None, False)
    assert not to_run("done", "a", None, True)
    assert not to_run("failed", "a", None, False) and to_run("timed-out", "a", None, True)
    assert not to_run("pending", "a", {"b"}, False)
    cell = Cell("a#1", "a", 1, ("m@a",), gpus=frozenset({1}))
    running = {"user": {"gpus": [1]}, "other": {"gpus": [0]}, "m@a": {"gpus": [1]}}
    assert holders_in_the_way(cell, running, {"m@a"}) == ["user"]
    assert eta_s([10, 20], 3) == 45 and eta_s([10], 4, parallel_width=2) == 20 and eta_s([], 0) == 0.0


GPU_MODELS = """
[builds.vllm]
engine = "vllm"
python = "/opt/vllm/bin/python"

[models.llama8b]
source = "{src}"
build = "vllm"
port = 8000
context = 8192
gpus = [0]
gpu_memory_utilization = 0.9
"""

GPU_CAMPAIGN = """
[campaign]
name = "h200-layouts"
model = "llama8b"

[[variants]]
name = "tp1"
gpus = [1]

[[variants]]
name = "tp2"
tp = 2
gpus = [0, 1]

[[variants]]
name = "2x"
replicas = 2
gpus = [[0], [1]]

[matrix]
"args.max-num-seqs" = [64, 256]

[[workloads]]
kind = "chat"
concurrency = [1, 8, 32]
input_tokens = 256
output_tokens = 128
requests = 64
"""


def test_plan_json_of_a_gpu_campaign_gives_fit_verdicts(tmp_path):
    """Rendered here against a saved two-H200 inventory (GPU 0 mostly held by someone else): planner only."""
    import json
    import subprocess
    import sys

    from servedeck.gpu import Inventory
    from servedeck.gpu.nvml import Gpu, GpuProcess

    src = tmp_path / "llama3-8b"
    src.mkdir()
    (src / "config.json").write_text((Path(__file__).parents[1] / "gpu/fixtures/llama3-8b.json").read_text())
    (tmp_path / "models.toml").write_text(GPU_MODELS.format(src=src))
    (tmp_path / "camp.toml").write_text(GPU_CAMPAIGN)
    GiB = 1024**3
    total = 140 * GiB
    gpus = (Gpu(0, "NVIDIA H200", "GPU-0", "0000:01:00.0", total, 100 * GiB, total - 100 * GiB,
                processes=(GpuProcess(999999, 100 * GiB),)),
            Gpu(1, "NVIDIA H200", "GPU-1", "0000:02:00.0", total, 0, total))
    (tmp_path / "inv.json").write_text(json.dumps(Inventory(True, gpus, driver_version="570.0").to_json()))
    res = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(tmp_path / "models.toml"), "campaign",
                          "plan", str(tmp_path / "camp.toml"), "--inventory", str(tmp_path / "inv.json"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    v = plan["variants"]
    assert v["tp1"]["fit"] == "fits" and v["tp2"]["fit"] == "no-room" and v["2x"]["fit"] == "no-room"
    assert [r["fit"]["status"] for r in v["2x"]["replicas"]] == ["no-room", "fits"]
    assert "GPU 0 (NVIDIA H200): needs 126" in v["tp2"]["replicas"][0]["fit"]["message"]
    assert v["max-num-seqs=64"]["fit"] == "no-room"  # inherits gpus = [0] from models.toml
    tp2 = v["tp2"]["replicas"][0]
    assert tp2["argv"][tp2["argv"].index("--tensor-parallel-size") + 1] == "2"
    assert tp2["memory_plan"]["kv_bytes_per_token"] == 131072  # Llama-3-8B: 32 layers × 8 heads × 128 × 2 × bf16
    assert [c["id"] for c in plan["cells"]] == ["tp1#1", "tp2#1", "2x#1", "max-num-seqs=64#1", "max-num-seqs=256#1"]
    assert plan["cells"][2]["gpus"] == [0, 1]
    assert plan["workloads"][0]["points"] == ["c=1", "c=8", "c=32"]


def test_cpus_render_as_cpuset_for_a_container_and_as_affinity_for_a_process(tmp_path):
    from servedeck.hostcpu import numa_nodes, numa_nodes_of, parse_cpulist

    text = """
[builds.img]
engine = "vllm"
image = "vllm/vllm-openai:v0.32.0"

[builds.bin]
engine = "llamacpp"
binary = "/opt/llama-server"

[models.a]
source = "org/model"
build = "img"
port = 8000
cpus = [0, 1]

[models.b]
source = "/m.gguf"
build = "bin"
port = 8001
cpus = [1]
"""
    c = parse_models(text, tmp_path / "models.toml")
    a = get_engine("vllm").render("a", c)
    assert "--cpuset-cpus=0-1" in a.argv and a.cpus == []  # a cpulist, in ranges, as the seed writes it
    assert parse_cpulist("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    nodes = numa_nodes()
    if nodes:  # this kernel exposes NUMA nodes: the container's memory comes from theirs
        assert f"--cpuset-mems={','.join(map(str, numa_nodes_of([0, 1])))}" in a.argv
    b = get_engine("llamacpp").render("b", c)
    assert b.cpus == [1] and not any("cpuset" in x for x in b.argv)
    with pytest.raises(ConfigError, match=r"models.b.cpus: cpus must be distinct"):
        parse_models(text.replace("cpus = [1]", "cpus = [1, 1]"), tmp_path / "models.toml")
