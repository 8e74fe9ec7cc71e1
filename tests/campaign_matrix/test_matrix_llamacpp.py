"""A campaign on real llama.cpp (SmolLM2-135M, context 2048, a handful of tiny requests), run by the CLI
as a user would: variants `parallel` 1 vs 4 pinned to one core each (run side by side with --parallel),
two replicas each pinned to its own core, one broken variant; two workloads. One campaign run shared by
the module's checks. Then interruptions: SIGINT mid-run and SIGKILL mid-cell, each followed by --resume."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from servedeck.config.load import load as load_models
from servedeck.deck import Deck
from servedeck.init import render_starter
from tests.conftest import TEST_MARK, SESSION, free_port

pytestmark = pytest.mark.engine

CHAT = """
[[workloads]]
kind = "chat"
concurrency = [1, 2]
input_tokens = 48
output_tokens = 8
requests = 4
warmup = 0

[[workloads]]
kind = "long-prompt"
prompt_tokens = 400
output_tokens = 4
requests = 1
warmup = 0
"""

MAIN = """
[campaign]
name = "t-smol"
model = "smollm2"
cell_timeout = "4m"
gate = { context = 600, depths = [0.5] }

[[variants]]
name = "p1"
args = { parallel = 1, threads = 1 }
cpus = [0]

[[variants]]
name = "p4"
args = { parallel = 4, threads = 1 }
cpus = [1]

[[variants]]
name = "2x"
args = { parallel = 2, threads = 1 }
replicas = 2
cpus = [[0], [1]]

[[variants]]
name = "broken"
args = { no-such-flag-at-all = true }
""" + CHAT


@pytest.fixture(scope="module")
def llama_ready() -> None:
    """llama-server and SmolLM2's GGUF, as scripts/setup.sh prepares them (this module needs nothing else)."""
    from servedeck.init import default_locations

    loc = default_locations()
    missing = [loc[k] for k in ("llama_server", "smollm2_gguf") if not Path(loc[k]).exists()]
    if missing:
        pytest.fail("engines/models not prepared (run scripts/setup.sh): " + ", ".join(missing))


def free_block(n: int = 10) -> int:
    """A port below the kernel's ephemeral range with the n after it free too: derived entries take the
    ports after the base model's, and an ephemeral neighbour may be some connection's local port."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 32000 - n)
        try:
            socks = []
            for p in range(base, base + n + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def models_toml(tmp: Path) -> Path:
    text = render_starter()
    text = text.replace("port = 8081", f"port = {free_block()}")
    for old in ("8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    assert text.index("[models.smollm2]") < text.index("context = 4096")
    text = re.sub(r"^context = \d+", "context = 2048", text, count=1, flags=re.M)  # the first model's: smollm2
    path = tmp / "models.toml"
    path.write_text(text)
    return path


def env_for(home: Path, results: Path) -> dict[str, str]:
    return {**os.environ, "SERVEDECK_HOME": str(home), "SERVEDECK_RESULTS": str(results), TEST_MARK: SESSION,
            "COLUMNS": "200"}


def cli(cfg: Path, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def start(cfg: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "servedeck", "--config", str(cfg), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def campaign_doc(results: Path) -> dict:
    folders = sorted((results / "campaigns").glob("*/campaign.json"))
    return json.loads(folders[-1].read_text()) if folders else {}


def stop_home(home: Path) -> None:
    from tests.conftest import stop_everything
    stop_everything(home)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory, llama_ready):
    tmp = tmp_path_factory.mktemp("matrix")
    home, results = tmp / "home", tmp / "results"
    home.mkdir()
    cfg = models_toml(tmp)
    camp = tmp / "camp.toml"
    camp.write_text(MAIN)
    env = env_for(home, results)
    t0 = time.monotonic()
    res = cli(cfg, env, "campaign", "run", str(camp), "--parallel", "--json", timeout=420)
    took = time.monotonic() - t0
    try:
        yield {"res": res, "cfg": cfg, "env": env, "results": results, "home": home, "took": took, "camp": camp}
    finally:
        stop_home(home)


def _view(results: Path, run: str) -> dict:
    from servedeck.runs.read import load
    return load(results / "runs" / run)


def test_broken_variant_is_a_failed_cell_and_the_rest_complete(main_run):
    res = main_run["res"]
    assert res.returncode == 1, res.stderr[-3000:]  # one cell failed: the campaign says so in its exit code
    doc = campaign_doc(main_run["results"])
    states = {c["id"]: c["state"] for c in doc["cells"]}
    assert states == {"p1#1": "done", "p4#1": "done", "2x#1": "done", "broken#1": "failed"}, \
        (states, [c["reason"] for c in doc["cells"]], res.stderr[-3000:])
    broken = next(c for c in doc["cells"] if c["id"] == "broken#1")
    assert len(broken["runs"]) == 1 and broken["reason"]
    view = _view(main_run["results"], broken["runs"][0])
    assert view["status"] == "failed" and view["kind"] == "launch"
    log = (main_run["results"] / "runs" / broken["runs"][0] / "server.log").read_text()
    assert "no-such-flag-at-all" in log
    assert view.get("cause"), view  # classified by doctor/forensics
    folder = next((main_run["results"] / "campaigns").glob("t-smol__*"))
    assert (folder / "campaign.toml").read_text() == main_run["camp"].read_text()
    assert "| p1 | chat | c=1 |" in (folder / "campaign.md").read_text()


def test_every_done_cell_has_a_gate_and_two_workload_runs_labelled_by_variant(main_run):
    doc = campaign_doc(main_run["results"])
    for cell in doc["cells"]:
        if cell["state"] != "done":
            continue
        kinds = [_view(main_run["results"], r) for r in cell["runs"]]
        gates = 2 if cell["variant"] == "2x" else 1  # every replica is gated
        assert [v["kind"] for v in kinds] == ["gate"] * gates + ["bench", "bench"], cell
        for v, name in zip(kinds, cell["runs"]):
            assert name.startswith(f"smollm2__{cell['variant']}__2k__llamacpp__"), name
            assert v["status"] == "ok", (name, v.get("reason"))
            assert v["campaign"] == {"name": "t-smol", "folder": Path(doc_folder(main_run)).name,
                                     "variant": cell["variant"], "repeat": 1, "cell": cell["id"]}
            assert v["gpus_used"] == 0 and v["replicas"] == (2 if cell["variant"] == "2x" else 1)
        assert kinds[gates]["gate"]["source"] == cell["runs"][0]  # the workloads inherit this launch's gate
    rows = json.loads(main_run["res"].stdout)["points"]
    assert {(r["variant"], r["workload"], r["point"]) for r in rows} >= {("p1", "chat", "c=1"), ("p4", "chat", "c=2"),
                                                                         ("2x", "long-prompt", "c=1")}


def doc_folder(main_run) -> str:
    return str(sorted((main_run["results"] / "campaigns").glob("t-smol__*"))[-1])


def test_replicas_both_served_and_their_own_counters_agree(main_run):
    doc = campaign_doc(main_run["results"])
    cell = next(c for c in doc["cells"] if c["id"] == "2x#1")
    chat = _view(main_run["results"], cell["runs"][2])
    for p in chat["points"]:
        reps = p["replicas"]
        assert len(reps) == 2 and all(r["requests"] > 0 for r in reps), reps
        assert sum(r["requests"] for r in reps) == 4
        # each server's own /metrics: generated tokens over the measured phase = its requests × 8
        assert [r["generated_tokens_by_server"] for r in reps] == [r["requests"] * 8 for r in reps], reps


def test_parallel_cells_on_disjoint_cpus_overlap_in_time(main_run):
    doc = campaign_doc(main_run["results"])
    c = {x["id"]: x for x in doc["cells"]}
    t = lambda s: datetime.fromisoformat(s).timestamp()  # noqa: E731
    a, b = c["p1#1"], c["p4#1"]
    assert t(a["started"]) < t(b["ended"]) and t(b["started"]) < t(a["ended"]), (a, b)
    # the replicas cell shares CPUs with both, so it ran alone
    x = c["2x#1"]
    for other in (a, b):
        assert t(x["started"]) >= t(other["ended"]) or t(x["ended"]) <= t(other["started"])


def test_status_and_runs_by_campaign(main_run):
    st = cli(main_run["cfg"], main_run["env"], "campaign", "status", "--json")
    assert st.returncode == 0, st.stderr
    view = json.loads(st.stdout)
    assert view["counts"] == {"done": 3, "failed": 1}
    runs = cli(main_run["cfg"], main_run["env"], "runs", "--campaign", "t-smol", "--json")
    names = [r["run"] for r in json.loads(runs.stdout)]
    assert len(names) == 3 * 3 + 1 + 1 and all(n.startswith("smollm2__") for n in names)
    assert not list((main_run["home"] / "live").glob("*.json"))  # every engine stopped


def test_cpus_pins_a_real_llama_server(tmp_path, llama_ready):
    cfg_path = models_toml(tmp_path)
    text = cfg_path.read_text().replace("args = { parallel = 4 }", "args = { parallel = 1 }\ncpus = [1]", 1)
    cfg_path.write_text(text)
    cfg = load_models(cfg_path)
    deck = Deck(cfg)
    rec = deck.start("smollm2").record
    try:
        assert rec.cpus == [1]
        engine = psutil.Process(rec.engine_pid)
        assert engine.cpu_affinity() == [1]
        assert "llama-server" in engine.name()
    finally:
        deck.stop(["smollm2"])


INTERRUPT = """
[campaign]
name = "t-int"
model = "smollm2"
cell_timeout = "4m"
gate = false

[[variants]]
name = "a"
args = { parallel = 1 }

[[variants]]
name = "b"
args = { parallel = 2 }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 48
output_tokens = 8
requests = 3
warmup = 0
"""


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _engines(home: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "llama-server" in " ".join(p.info["cmdline"] or []) and p.environ().get("SERVEDECK_HOME") == str(home):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_sigint_then_sigkill_then_resume_redoes_only_unfinished_cells(tmp_path, llama_ready):
    home, results = tmp_path / "campaign-home", tmp_path / "results"
    home.mkdir()
    cfg = models_toml(tmp_path)
    camp = tmp_path / "int.toml"
    camp.write_text(INTERRUPT)
    env = env_for(home, results)
    cells = lambda: {c["id"]: c for c in campaign_doc(results).get("cells", [])}  # noqa: E731
    try:
        # 1. Ctrl-C while cell b's engine is up: b goes back to pending, its engine is stopped, a stays done
        p = start(cfg, env, "campaign", "run", str(camp))
        _wait(lambda: cells().get("b#1", {}).get("state") == "running" and _engines(home), 240, "cell b's engine")
        p.send_signal(signal.SIGINT)
        p.wait(60)
        assert p.returncode == 130, p.stderr.read()[-2000:]
        after_int = cells()
        assert after_int["a#1"]["state"] == "done" and after_int["b#1"]["state"] == "pending"
        assert "interrupted" in after_int["b#1"]["reason"]
        assert not _engines(home)
        journal = [json.loads(ln) for ln in (home / "journal.jsonl").read_text().splitlines()]
        assert not [r for r in journal if r["event"] == "crash"], journal  # a Ctrl-C is a stop, not a crash
        a_runs = after_int["a#1"]["runs"]

        # 2. SIGKILL while b's engine is up: the engine is orphaned (its shim leads its own group)
        p = start(cfg, env, "campaign", "run", str(camp), "--resume")
        _wait(lambda: cells().get("b#1", {}).get("state") == "running" and _engines(home), 240, "b's engine")
        orphan = _engines(home)[0].pid
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        assert psutil.pid_exists(orphan)

        # 3. --resume reaps it and redoes b (not a)
        res = cli(cfg, env, "campaign", "run", str(camp), "--resume", "--json", timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        final = cells()
        assert {k: v["state"] for k, v in final.items()} == {"a#1": "done", "b#1": "done"}
        assert final["a#1"]["runs"] == a_runs  # not redone
        assert final["b#1"]["runs"]
        # b was launched three times (interrupted, killed, done), a once; every launch has ended
        launches = {m: sorted((home / "launches" / m).iterdir()) for m in ("smollm2@a", "smollm2@b")}
        assert (len(launches["smollm2@a"]), len(launches["smollm2@b"])) == (1, 3)
        for d in launches["smollm2@b"]:
            assert json.loads((d / "launch.json").read_text())["state"] in ("stopped", "failed"), d
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
        assert not _engines(home)
        assert "left by an earlier run" in res.stderr
        folders = list((results / "campaigns").glob("t-int__*"))
        assert len(folders) == 1  # one campaign, resumed twice
    finally:
        stop_home(home)


REFERENCE = """
[campaign]
name = "t-ref"
model = "smollm2"
cell_timeout = "6m"
gate = false
reference = "plain"
reference_prompts = 3
reference_tokens = 32

[[variants]]
name = "plain"
args = { parallel = 1 }

[[variants]]
name = "rope"
args = { parallel = 1, rope-freq-base = 10 }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 64
output_tokens = 4
requests = 1
warmup = 0
"""


def test_reference_variant_compares_greedy_outputs_token_by_token(tmp_path, llama_ready):
    """`reference = "plain"`: every launch answers the fixed greedy prompts and is compared token by token
    with plain's; a broken RoPE base differs from the first token. (Speculating against plain is
    tests/campaign/test_workloads.py's; bench/workloads.py --check-outputs runs the full 8-prompt check:
    on llama.cpp 11434's CPU n-gram speculation it changed 2 of 8 greedy answers, code prompt 3 from token 69.)"""
    home, results = tmp_path / "ref-home", tmp_path / "results"
    home.mkdir()
    cfg = models_toml(tmp_path)
    camp = tmp_path / "camp.toml"
    camp.write_text(REFERENCE)
    env = env_for(home, results)
    try:
        res = cli(cfg, env, "campaign", "run", str(camp), "--json", timeout=600)
    finally:
        stop_home(home)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = campaign_doc(results)
    ovr = doc["outputs_vs_reference"]
    assert ovr["reference"] == "plain" and set(ovr["cells"]) == {"rope#1"}, ovr
    broken = ovr["cells"]["rope#1"]
    assert broken["prompts"] == 3
    assert broken["verdict"] == "differs" and broken["first_difference"]["position"] == 0, broken
    md = next((results / "campaigns").glob("t-ref__*")).joinpath("campaign.md").read_text()
    assert "Greedy outputs against the reference variant `plain`" in md and "| rope#1 | differs |" in md
