"""models.toml `replicas = 2` on real llama-servers (SmolLM2, each replica pinned to one core): the
entry starts both, holds its slot against other models, is evicted whole by a switch, and a bench
over the entry spreads its requests across both (each replica's own counters agree). A replica that
cannot start takes the ones already started down with it."""

from __future__ import annotations

import json
import socket

import pytest

from servedeck.workloads.points import BenchSpec
from servedeck.deck import Deck
from servedeck.errors import RefusedError
from servedeck.loadgen import ClosedLoop
from servedeck.modelsfile import parse
from servedeck.supervisor.process import group_members

from ports import free_port_pair

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def config(tmp_path, engines: dict[str, str], port: int | None = None):
    port = port or free_port_pair()
    text = f"""
[builds.llamacpp]
engine = "llamacpp"
binary = "{engines['llama_server']}"

[models.smol]
source = "{engines['smollm2_gguf']}"
build = "llamacpp"
port = {port}
slot = "main"
context = 1024
replicas = 2
cpus = [[0], [1]]
aliases = ["pair"]

[models.gemma]
source = "{engines['gemma_gguf']}"
build = "llamacpp"
port = {free_port_pair()}
slot = "main"
context = 1024
"""
    path = tmp_path / "models.toml"
    path.write_text(text)
    return parse(text, path)


def test_an_entry_with_replicas_starts_holds_its_slot_and_is_evicted_whole(tmp_path, engines_ready):
    cfg = config(tmp_path, engines_ready)
    deck = Deck(cfg)
    res = deck.start("pair")
    assert [r.model for r in res.records] == ["smol.r1", "smol.r2"]
    r1, r2 = res.records
    assert r2.port == r1.port + 1 and r1.pgid != r2.pgid and r1.slot == r2.slot == "main"
    with pytest.raises(RefusedError) as e:
        deck.start("gemma")
    assert "smol.r1" in e.value.message and "smol.r2" in e.value.message
    again = deck.start("smol")
    assert again.already_running and [r.pid for r in again.records] == [r1.pid, r2.pid]
    sw = deck.switch("gemma")
    assert sorted(sw.evicted) == ["smol.r1", "smol.r2"]
    assert not group_members(r1.pgid) and not group_members(r2.pgid)
    deck.stop(["gemma"])


def test_a_bench_over_the_entry_spreads_across_both_replicas(tmp_path, engines_ready):
    from servedeck.workloads.session import Outcome, measured, run as bench
    from servedeck.loadgen.loop import run as run_loop

    cfg = config(tmp_path, engines_ready)
    spec = BenchSpec(workload="chat", shapes=(ClosedLoop(4),), input_tokens=64, output_tokens=16, requests=12,
                     warmup=1)
    out = Outcome()
    with measured(cfg, "smol", True, out) as target:
        assert [t.name for t in target.replicas] == ["smol.r1", "smol.r2"]
        run_loop(bench(target, spec, gate_mode=False, outcome=out))
    summary = json.loads((out.folder / "summary.json").read_text())
    assert summary["model"] == "smol" and summary["layout"] == "2xtp1" and summary["replicas"] == 2
    assert summary["cpus"] == [[0], [1]]
    [point] = summary["points"]
    served = {r["replica"]: r for r in point["replicas"]}
    # fewest-in-flight: the four users' opening requests go two to each replica whatever their speed; after
    # that a replica gets a request as often as it finishes one, so a replica on a busier core gets fewer
    # (a fresh-clone run with the other test worker's engine on core 1: 10 and 2)
    assert served[1]["requests"] + served[2]["requests"] == 12, point["replicas"]
    assert served[1]["requests"] >= 2, point["replicas"]
    assert served[2]["requests"] >= 2, point["replicas"]
    for r in served.values():  # each replica's own counter agrees with what the client sent it
        assert r["generated_tokens_by_server"] >= r["requests"] * 16
    assert not Deck(cfg).running(), "a bench that launched the entry stops every replica"


def test_a_replica_that_cannot_start_takes_the_started_ones_down(tmp_path, engines_ready):
    port = free_port_pair()
    cfg = config(tmp_path, engines_ready, port)
    with socket.socket() as squatter:  # replica 2's port is taken by someone else
        squatter.bind(("127.0.0.1", port + 1))
        squatter.listen()
        with pytest.raises(RefusedError) as e:
            Deck(cfg).start("smol")
    assert f"port {port + 1}" in e.value.message
    assert not Deck(cfg).running(), "replica 1 must not be left serving alone"
