"""Holders (real process trees mapped through live records) and the fit check (built inventories).

There is no GPU here, so NVML's part is an Inventory built by hand with the pids of real processes:
the mapping from pid to model is the real psutil walk over real process groups and descendants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from servedeck import paths
from servedeck.engines import get_engine
from servedeck.gpu.fit import FITS, NO_ROOM, RUNNING, UNKNOWN, check_fit, wait_for_fit
from servedeck.gpu.holders import (
    attribute, by_holder, describe_gpu_holders, holders, live_records, model_gpu_use, pid_owners,
)
from servedeck.gpu.nvml import Gpu, GpuProcess, Inventory, inventory

GiB = 1024**3

# parent (own session = own process group) → child in the group → grandchild that left the group (setsid),
# like vLLM's API server → EngineCore → workers. Each prints its pid, then sleeps.
TREE = r"""
import os, subprocess, sys, time
if len(sys.argv) > 1 and sys.argv[1] == "leaf":
    if sys.argv[2] == "setsid":
        os.setsid()
    print(os.getpid(), flush=True); time.sleep(60)
else:
    kids = [subprocess.Popen([sys.executable, __file__, "leaf", m], stdout=subprocess.PIPE, text=True) for m in ("stay", "setsid")]
    pids = [k.stdout.readline().strip() for k in kids]
    print(os.getpid(), *pids, flush=True); time.sleep(60)
"""


@pytest.fixture
def engine_tree(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    yield p, pids
    for pid in pids[1:]:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.kill()
    p.wait()


def write_live(model: str, pid: int, **extra) -> None:
    rec = {"model": model, "pid": pid, "pgid": os.getpgid(pid), "port": 8000, "launch_dir": "/x",
           "engine": "vllm", "build": "stock", "started_at": psutil.Process(pid).create_time(), **extra}
    (paths.live_dir() / f"{model}.json").write_text(json.dumps(rec))


def inv_with(*procs: tuple[int, int], total: int = 140 * GiB, gpus: int = 1) -> Inventory:
    used = sum(u for _, u in procs)
    g = [Gpu(index=i, name="NVIDIA H200", uuid=f"GPU-{i}", pci_bus_id=f"0000:0{i}:00.0", memory_total=total,
             memory_used=used if i == 0 else 0, memory_free=total - (used if i == 0 else 0),
             power_w=120.0, power_limit_w=700.0,
             processes=tuple(GpuProcess(pid, u) for pid, u in procs) if i == 0 else ())
         for i in range(gpus)]
    return Inventory(available=True, gpus=tuple(g), driver_version="570.0")


def test_inventory_here_says_why_there_is_no_gpu():
    inv = inventory()
    if inv.available:
        pytest.skip("this host has a GPU")
    assert inv.gpus == () and inv.reason and ("NVML" in inv.reason or "driver" in inv.reason)


def test_inventory_json_round_trip():
    inv = inv_with((1, 2 * GiB))
    assert Inventory.from_json(json.loads(json.dumps(inv.to_json()))) == inv


def test_children_and_setsid_grandchildren_map_to_the_model(engine_tree):
    _, (parent, child, leaver) = engine_tree
    assert os.getpgid(leaver) != os.getpgid(parent)  # it really left the group
    write_live("gemma", parent)
    inv = inv_with((child, int(60 * GiB)), (leaver, int(33.5 * GiB)), (os.getpid(), 1 * GiB))
    hs = holders(inv)
    owners = {h.pid: h.model for h in hs}
    assert owners[child] == "gemma" and owners[leaver] == "gemma"
    assert owners[os.getpid()] is None  # this test process is nobody's model
    assert describe_gpu_holders(hs, 0)[0] == "gemma on GPU 0 holds 93.5 GiB"  # summed over its pids
    # named as the kernel names it: python, or pytest-xdist's worker title under two workers
    me = psutil.Process().name()
    assert describe_gpu_holders(hs, 0)[1].startswith(f"{me} (pid {os.getpid()}, user ")
    assert model_gpu_use("gemma", hs) == {0: int(93.5 * GiB)}


def test_a_reused_pid_is_not_the_model(engine_tree):
    _, (parent, child, _) = engine_tree
    write_live("old", parent, create_time=psutil.Process(parent).create_time() - 3600)
    assert child not in pid_owners() and parent not in pid_owners()


def test_live_records_skip_torn_files():
    (paths.live_dir() / "bad.json").write_text("{not json")
    (paths.live_dir() / "ok.json").write_text(json.dumps({"pid": 1}))
    assert [r["model"] for r in live_records()] == ["ok"]


def test_attribute_is_pure():
    inv = inv_with((10, 5 * GiB), (11, GiB))
    hs = attribute(inv, {10: "qwen"}, {11: ("python3", "bob", "python3 train.py")})
    assert [(h.model, h.process, h.user) for h in hs] == [("qwen", "?", None), (None, "python3", "bob")]
    assert by_holder(hs, 0) == [("qwen", 5 * GiB), ("python3 (pid 11, user bob)", GiB)]


# ---------------------------------------------------------------- fit
VLLM, LLAMACPP = get_engine("vllm").memory, get_engine("llamacpp").memory


def held_by_gemma() -> tuple[Inventory, list]:
    inv = inv_with((100, int(93.5 * GiB)), total=141 * GiB)
    return inv, attribute(inv, {100: "gemma"})


def test_vllm_utilisation_is_a_requirement_and_refusal_names_the_holder():
    inv, hs = held_by_gemma()
    rep = check_fit("qwen27b", VLLM, [0], inv, hs, utilization=0.95)
    assert rep.status == NO_ROOM and not rep.ok
    msg = rep.message()
    assert "needs 133.9 GiB free, 47.5 GiB is free of 141.0 GiB" in msg
    assert "gemma on GPU 0 holds 93.5 GiB" in msg and "gpu_memory_utilization 0.95" in msg
    err = rep.refusal(slot_mates=["gemma"])  # gemma shares qwen27b's slot: switch would stop it
    assert "gemma" in err.hint and "switch qwen27b" in err.hint
    assert "lower" not in (msg + err.hint).lower()  # never suggests quietly lowering it
    assert "need: planned (planned" not in msg and "(needed: gpu_memory_utilization" in msg  # no stutter


def test_refusal_hint_names_a_command_that_would_work_when_the_holder_is_in_another_slot():
    """Defect: on the H200 the hint said `servedeck switch second`, but switch evicts only the target's
    slot, so that command was refused again. A holder of another slot is evicted by name."""
    inv, hs = held_by_gemma()
    err = check_fit("qwen27b", VLLM, [0], inv, hs, utilization=0.95).refusal(slot_mates=["other"])
    assert "switch" not in err.hint
    assert "`servedeck start qwen27b --evict gemma`" in err.hint and "`servedeck stop gemma`" in err.hint
    foreign = attribute(inv, {})  # the memory is held by a process servedeck did not start
    err = check_fit("qwen27b", VLLM, [0], inv, foreign, utilization=0.95).refusal()
    assert "--evict" not in err.hint and "not servedeck's" in err.hint


def test_switch_counts_the_evicted_models_memory_as_free():
    inv, hs = held_by_gemma()
    rep = check_fit("qwen27b", VLLM, [0], inv, hs, utilization=0.95, releasing=["gemma"])
    assert rep.status == FITS and rep.gpus[0].free == 141 * GiB


def test_fits_running_unknown_and_missing_gpu():
    inv, hs = held_by_gemma()
    assert check_fit("small", VLLM, [0], inv, hs, utilization=0.3).status == FITS
    assert check_fit("gemma", VLLM, [0], inv, hs, utilization=0.9).status == RUNNING
    none = Inventory(available=False, reason="no NVIDIA driver here")
    rep = check_fit("x", VLLM, [0], none, [])
    assert rep.status == UNKNOWN and rep.ok and "no NVIDIA driver" in rep.reason
    assert check_fit("x", VLLM, [3], inv, hs).status == NO_ROOM
    # llama.cpp without a plan cannot be judged: unknown, not a refusal
    assert check_fit("x", LLAMACPP, [0], inv, hs).status == UNKNOWN


def test_llamacpp_need_comes_from_the_plan():
    from servedeck.gpu.plan import PlanInputs, compute
    from servedeck.gpu.arch import from_hf_config
    from pathlib import Path

    cfg = json.loads((Path(__file__).parent / "fixtures/llama3-8b.json").read_text())
    plan = compute(from_hf_config(cfg, "l", 4_920_000_000), PlanInputs(engine="llamacpp", memory=LLAMACPP, context=131072, parallel=4))
    inv, hs = held_by_gemma()
    rep = check_fit("llama", LLAMACPP, [0], inv, hs, plan=plan)
    assert rep.status == NO_ROOM and rep.gpus[0].need == plan.need_bytes_per_gpu  # 64 GiB of KV + weights
    assert "planned" in rep.need_basis


def test_wait_for_fit_polls_until_memory_is_released():
    inv, hs = held_by_gemma()
    states = [check_fit("q", VLLM, [0], inv, hs, utilization=0.95)] * 2 + \
             [check_fit("q", VLLM, [0], inv_with(total=141 * GiB), [], utilization=0.95)]
    seen = []
    t0 = time.monotonic()
    rep, waited = wait_for_fit(None, "q", timeout_s=5, poll_s=0.01, read=lambda: states.pop(0),
                               on_wait=lambda r, w: seen.append(r.status))
    assert rep.status == FITS and seen == [NO_ROOM, NO_ROOM] and time.monotonic() - t0 < 2 and waited >= 0.02


def test_wait_for_fit_gives_up_with_the_refusal():
    inv, hs = held_by_gemma()
    rep, _ = wait_for_fit(None, "q", timeout_s=0.05, poll_s=0.01,
                          read=lambda: check_fit("q", VLLM, [0], inv, hs, utilization=0.95))
    assert rep.status == NO_ROOM and "gemma on GPU 0 holds 93.5 GiB" in rep.message()
