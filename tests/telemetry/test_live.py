"""`servedeck gpu --watch` and the doctor's power row read the sampler's own GPU lines. No GPU here:
RECORDED readings (written in NVML's units, not captured) replayed through SERVEDECK_TELEMETRY_GPU_REPLAY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from servedeck.config.schema import Host
from servedeck.doctor.checks import check_power
from servedeck.fsio import read_jsonl
from servedeck.gpu.nvml import Gpu, Inventory
from servedeck.telemetry.live import readings_now
from servedeck.telemetry.nvml_source import RecordedSource
from servedeck.telemetry.sampler import PointSampler, Settings

READINGS = [{"gpu": 0, "power_mw": 451_200 + 1000 * k, "energy_mj": 9_000_000 + 90_000 * k, "limit_mw": 700_000,
             "mem_used": 30 * 2**30, "mem_total": 141 * 2**30, "sm_util": 85, "mem_util": 40, "sm_clock_mhz": 1755,
             "mem_clock_mhz": 2619, "reasons": 0x4 if k == 0 else 0, "temp_c": 55} for k in range(3)]


def _capture(tmp_path):
    path = tmp_path / "capture.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in READINGS))
    return path


def _strip(ln: dict) -> dict:
    return {k: v for k, v in ln.items() if k not in ("t", "point")}


def test_gpu_watch_json_prints_the_lines_a_run_would_write(tmp_path):
    env = {**os.environ, "SERVEDECK_TELEMETRY_GPU_REPLAY": str(_capture(tmp_path))}
    r = subprocess.run([sys.executable, "-m", "servedeck", "gpu", "--watch", "--json", "--count", "3",
                        "--interval", "0.05s"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    watched = [json.loads(x) for x in r.stdout.splitlines()]
    s = PointSampler(tmp_path / "t.jsonl", 0, engine=None, gpu_source=RecordedSource(READINGS), gpus=None,
                     settings=Settings(gpu_interval_s=0.05))
    s.start()
    while len([ln for ln in read_jsonl(tmp_path / "t.jsonl") if ln["kind"] == "sample"]) < 3:
        time.sleep(0.02)
    s.stop()
    sampled = [ln for ln in read_jsonl(tmp_path / "t.jsonl") if ln["kind"] == "sample"][:3]
    assert [_strip(x) for x in watched] == [_strip(x) for x in sampled]


def test_gpu_watch_without_a_gpu_says_why(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SERVEDECK_TELEMETRY_GPU_REPLAY"}
    r = subprocess.run([sys.executable, "-m", "servedeck", "gpu", "--watch", "--count", "1"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "no GPU to watch" in r.stderr and "NVML" in r.stderr and "Traceback" not in r.stderr


def test_doctor_power_row_says_the_current_draw_from_the_same_samples():
    inv = Inventory(True, gpus=(Gpu(index=0, name="NVIDIA H200", uuid="GPU-x", pci_bus_id="0", memory_total=141 * 2**30,
                                    memory_used=0, memory_free=141 * 2**30, power_limit_w=700.0),))
    now = readings_now(RecordedSource(READINGS))
    row = check_power(Host(power_min_w=400, power_max_w=700), inv, now)
    assert row.status == "OK"
    assert "now GPU 0 drawing 451.2 W (64% of 700 W), clocks held by sw_power_cap" in row.saw


def test_doctor_power_row_says_when_the_draw_cannot_be_read():
    inv = Inventory(True, gpus=(Gpu(index=0, name="NVIDIA H200", uuid="GPU-x", pci_bus_id="0", memory_total=1,
                                    memory_used=0, memory_free=1, power_limit_w=700.0),))
    row = check_power(Host(power_min_w=400, power_max_w=700), inv, readings_now(RecordedSource([])))
    assert "current draw not read: the recorded readings hold GPU(s) []" in row.saw
