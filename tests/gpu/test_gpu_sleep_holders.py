"""A sleeping model among the GPU's holders: named as asleep, with what frees it, wherever memory is
counted (the holders list behind `servedeck gpu`, the fit check behind every start, doctor's gpu and
host-ram rows). No GPU here: the inventory is built by hand with the pid of a real process, whose live
record says asleep; the pid → model walk is the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from servedeck import paths
from servedeck.doctor.checks import check_gpu, check_host_ram
from servedeck.engines import get_engine
from servedeck.gpu.fit import NO_ROOM, check_fit
from servedeck.gpu.holders import describe_gpu_holders, holders
from servedeck.gpu.nvml import Gpu, GpuProcess, Inventory
from servedeck.modelsfile import parse

GiB = 2**30


@pytest.fixture
def sleeper():
    """A process standing for a sleeping vLLM engine, recorded live as `qwen`, asleep at level 1."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    rec = {"model": "qwen", "pid": p.pid, "pgid": os.getpgid(p.pid), "port": 8000, "launch_dir": "/x",
           "engine": "vllm", "build": "stock", "create_time": psutil.Process(p.pid).create_time(),
           "state": "asleep", "sleep_level": 1, "asleep_host_bytes": 15 * GiB}
    (paths.live_dir()).mkdir(parents=True, exist_ok=True)
    (paths.live_dir() / "qwen.json").write_text(json.dumps(rec))
    yield p.pid
    p.kill()
    p.wait()


def h200(*procs: tuple[int, int]) -> Inventory:
    used = sum(u for _, u in procs)
    return Inventory(True, (Gpu(0, "NVIDIA H200", "GPU-0", "0000:01:00.0", 141 * GiB, used, 141 * GiB - used,
                                processes=tuple(GpuProcess(p, u) for p, u in procs)),))


def test_a_sleeping_holder_is_named_asleep_with_what_frees_it(sleeper):
    inv = h200((sleeper, int(1.9 * GiB)), (4242, 127 * GiB))
    hs = holders(inv)
    mine = next(h for h in hs if h.pid == sleeper)
    assert mine.model == "qwen" and mine.asleep_level == 1
    assert mine.describe() == "qwen (asleep) on GPU 0 holds 1.9 GiB; `servedeck stop qwen` frees it"
    words = describe_gpu_holders(hs, 0)
    assert "qwen (asleep) on GPU 0 holds 1.9 GiB; `servedeck stop qwen` frees it" in words


def test_the_fit_check_counts_what_a_sleeper_holds_and_names_it(sleeper):
    """127 GiB held by another process and 1.9 GiB by qwen asleep: a start needing 0.9 of 141 GiB does not
    fit, and the refusal names the sleeper as such."""
    inv = h200((sleeper, int(1.9 * GiB)), (4242, 13 * GiB))
    rep = check_fit("gemma", get_engine("vllm").memory, [0], inv, holders(inv), utilization=0.9)
    assert rep.status == NO_ROOM
    assert "qwen (asleep) on GPU 0 holds 1.9 GiB; `servedeck stop qwen` frees it" in rep.message()


def test_doctor_names_a_sleeper_in_its_gpu_and_host_ram_rows(sleeper, tmp_path):
    cfg = parse("""
[builds.stock]
engine = "vllm"
python = "/x/bin/python"
[models.gemma]
source = "/models/gemma"
build = "stock"
port = 8001
gpu_memory_utilization = 0.9
host_ram_gib = 1
""", tmp_path / "models.toml")
    inv = h200((sleeper, int(1.9 * GiB)), (4242, 13 * GiB))
    row = check_gpu(cfg, "gemma", inv, holders(inv))
    assert row.status == "FAIL" and "qwen (asleep) on GPU 0 holds 1.9 GiB; `servedeck stop qwen` frees it" in row.saw
    ram = check_host_ram("gemma", cfg.models["gemma"], available=64 * GiB, asleep={"qwen": 15 * GiB})
    assert ram.status == "OK" and "asleep at level 1, pinning host memory: qwen 15.0 GiB" in ram.saw
    assert "`servedeck stop qwen` frees it" in ram.saw
    short = check_host_ram("gemma", cfg.models["gemma"], available=GiB // 2, asleep={"qwen": 15 * GiB})
    assert short.status == "FAIL" and "qwen 15.0 GiB" in short.saw and short.data["asleep_pinned"] == {"qwen": 15 * GiB}
