"""Real run folders for the report tests, made once per module: tiny llama.cpp benches of SmolLM2.

    a1, a2   threads = 1, the same --seed: a configuration and a repeat of it (fresh launches)
    b        threads = 2, same seed: one flag changed
    rope     threads = 1 and rope-freq-base = 10: a RoPE misconfiguration that fails the gate
    long     threads = 1, long-prompt workload, no gate

One thread but in b: under two test workers (tests/workers.py) another engine holds the other core, and a
llama-server of two threads then waits at its barriers for a thread that is not running (a 128-token TPOT
went from 15 ms to 1,066 ms here, 2026-12-04).

Each is `bench --launch` (its own launch, stopped afterwards). The headless Chromium the HTML test
starts is guarded here too: no chromium process may outlive the session.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from servedeck.workloads.points import BenchSpec
from servedeck.workloads.session import Outcome, measured, run as bench
from servedeck.loadgen.loop import run as run_loop
from servedeck.modelsfile import load
from servedeck.gates import GateSpec
from servedeck.init import default_locations, render_starter
from servedeck.loadgen import ClosedLoop

from reportkit import SEED, chromium_processes
from ports import free_port  # below the kernel's ephemeral range: tests/ports.py says why

TEST_MARK = "SERVEDECK_TEST_RUN"  # as tests/conftest.py: the root guard stops and counts engines marked so
SESSION = str(os.getpid())


@dataclass
class RealRuns:
    results: Path
    home: Path
    a1: Path
    a2: Path
    b: Path
    rope: Path
    long: Path


def _toml(port: int, args: str) -> str:
    text = render_starter()
    block = re.search(r"\[models\.smollm2\]\n(.*?)\n\n", text, re.S)
    assert block
    new = re.sub(r"port = \d+", f"port = {port}", block.group(0))
    new = re.sub(r"args = \{[^}]*\}", f"args = {{ {args} }}", new)
    new = new.replace("context = 8192", "context = 1024")
    return text.replace(block.group(0), new)


def _bench(tmp: Path, name: str, args: str, spec: BenchSpec, gate: bool | None) -> Path:
    cfg_path = tmp / f"{name}.toml"
    cfg_path.write_text(_toml(PORT, args))
    out = Outcome()
    with measured(load(cfg_path), "smollm2", True, out) as target:  # started for this run, stopped after it
        run_loop(bench(target, spec, gate_mode=gate, gate_spec=GateSpec(context=384, depths=(0.5,)), outcome=out))
    assert out.folder is not None
    return out.folder


PORT = free_port()


@pytest.fixture(scope="session")
def llama_ready() -> None:
    """What these runs need of scripts/setup.sh: llama-server and the SmolLM2 GGUF (not vLLM)."""
    loc = default_locations()
    missing = [f"{k}={loc[k]}" for k in ("llama_server", "smollm2_gguf") if not Path(loc[k]).exists()]
    if missing:
        pytest.fail("not prepared (run scripts/setup.sh): " + ", ".join(missing))


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory, llama_ready) -> Iterator[RealRuns]:
    tmp = tmp_path_factory.mktemp("report-runs")
    keep = os.environ.get("SERVEDECK_REPORT_KEEP")  # a folder to keep the runs in (to look at them afterwards)
    home, results = tmp / "home", (Path(keep) / "results" if keep else tmp / "results")
    home.mkdir()
    chat = BenchSpec(workload="chat", shapes=(ClosedLoop(1), ClosedLoop(2)), output_tokens=12, input_tokens=96,
                     requests=6, warmup=1, seed=SEED)
    long = BenchSpec(workload="long-prompt", shapes=(ClosedLoop(1),), output_tokens=4, prompt_tokens=300,
                     requests=2, warmup=0, seed=SEED)
    made = Path(keep) / "runs.json" if keep else None
    if made is not None and made.exists():  # a developer's re-run: the runs an earlier session kept there
        yield RealRuns(results=results, home=home, **{k: Path(v) for k, v in json.loads(made.read_text()).items()})
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(home))
        mp.setenv("SERVEDECK_RESULTS", str(results))
        mp.setenv(TEST_MARK, SESSION)
        mp.delenv("SERVEDECK_CONFIG", raising=False)
        runs = RealRuns(results=results, home=home,
                        a1=_bench(tmp, "a1", "parallel = 2, threads = 1", chat, None),
                        a2=_bench(tmp, "a2", "parallel = 2, threads = 1", chat, None),
                        b=_bench(tmp, "b", "parallel = 2, threads = 2", chat, None),
                        rope=_bench(tmp, "rope", "parallel = 2, threads = 1, rope-freq-base = 10", chat, None),
                        long=_bench(tmp, "long", "parallel = 2, threads = 1", long, False))
    if made is not None:
        made.write_text(json.dumps({k: str(getattr(runs, k)) for k in ("a1", "a2", "b", "rope", "long")}))
    yield runs


@pytest.fixture(scope="session", autouse=True)
def no_chromium_left() -> Iterator[None]:
    yield
    left = chromium_processes()
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"chromium processes left running by the report tests: {[p.pid for p in left]}"

