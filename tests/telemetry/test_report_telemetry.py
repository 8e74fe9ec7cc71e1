"""The report's telemetry on a real llama.cpp bench: the timeline per point, the energy Pareto and
table, and energy in compare; the HTML looked at in headless Chromium.

The GPU lane runs on RECORDED readings (SERVEDECK_TELEMETRY_GPU_REPLAY): this machine has no GPU.
The readings are written below in NVML's units (450 W, the energy counter 90 J further on at every
reading, a 700 W limit), not captured; the engine lane is the real llama-server's /metrics."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from servedeck.workloads.points import BenchSpec
from servedeck.loadgen import ClosedLoop
from servedeck.report.build import write
from servedeck.report.collect import from_runs
from servedeck.report.compare import compare
from servedeck.runs import load
from telemetrykit import run_bench

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

PURPLE = (148, 103, 189)  # matplotlib's C4: the timeline's power line, nothing else on the page
CHROME_MARK = "servedeck-telemetry-test-chromium"


def _capture(path: Path) -> Path:
    lines = [{"gpu": 0, "power_mw": 450_000, "energy_mj": 5_000_000_000 + 90_000 * k, "limit_mw": 700_000,
              "mem_used": 30 * 2**30, "mem_total": 141 * 2**30, "sm_util": 80, "mem_util": 35, "sm_clock_mhz": 1980,
              "mem_clock_mhz": 2619, "reasons": 0, "temp_c": 50} for k in range(5000)]
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    return path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, campaign_config, llama):
    tmp = tmp_path_factory.mktemp("telemetry-report")
    spec = BenchSpec(workload="chat", shapes=(ClosedLoop(1), ClosedLoop(2)), input_tokens=64, output_tokens=16,
                     requests=3, warmup=0, seed=11)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_TELEMETRY_GPU_REPLAY", str(_capture(tmp / "capture.jsonl")))
        mp.setenv("SERVEDECK_TELEMETRY_ENGINE_S", "0.2")
        mp.setenv("SERVEDECK_TELEMETRY_GPU_S", "0.1")
        mp.setenv("SERVEDECK_RESULTS", str(tmp / "results"))
        return [run_bench(campaign_config, "smollm2", spec, gate_mode=False).folder for _ in range(2)]


def test_replayed_gpu_readings_give_energy_per_token(two_runs):
    for p in load(two_runs[0])["points"]:
        gpu = p["figures"]["telemetry"]["gpu"]
        assert gpu["energy_source"] == "energy counter"
        assert gpu["energy_j"] > 0 and gpu["output_tokens"] == 3 * 16
        assert gpu["j_per_output_token"] == pytest.approx(gpu["energy_j"] / 48)
        assert gpu["mean_power_w"] == pytest.approx(450.0) and gpu["max_share_of_limit"] == pytest.approx(450 / 700)
        assert p["headline"]["j_per_output_token"] == gpu["j_per_output_token"]  # beside the other headline figures


def test_compare_carries_energy_per_token(two_runs):
    coll = from_runs(two_runs)
    c = compare([coll.runs[0]], [coll.runs[1]])
    energy = next(v for v in c.points[0].verdicts if v.figure == "J per output token")
    assert energy.n_a == 1 and energy.n_b == 1  # one figure per launch, as output tok/s
    gpu = [load(r)["points"][0]["figures"]["telemetry"]["gpu"] for r in two_runs]
    assert energy.a == pytest.approx(gpu[0]["j_per_output_token"]) and energy.b == pytest.approx(gpu[1]["j_per_output_token"])


def _screenshot(html: Path, png: Path, tmp: Path) -> None:
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is not installed (scripts/setup.sh installs it)"
    proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             f"--user-data-dir={tmp / CHROME_MARK}", "--window-size=1200,9000", f"--screenshot={png}",
                             html.as_uri()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its helpers share the group
        except ProcessLookupError:
            pass
        proc.wait()


def _pixels(png: Path, rgb: tuple[int, int, int], tol: int = 40) -> int:
    a = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((np.abs(a - np.array(rgb)).sum(axis=2) < tol).sum())


def test_report_has_timeline_and_energy_and_chromium_draws_the_power_lane(two_runs, tmp_path):
    md_path, html = write(from_runs(two_runs), tmp_path / "out")
    md = md_path.read_text()
    assert "## Energy per token" in md
    assert "## What the engine and the GPUs did during each point" in md
    assert "energy counter" in md  # where the energy figure came from, in the table
    assert "| waiting in the engine at arrival | requests | TTFT p50 |" in md  # TTFT against queue depth
    page = html.read_text()
    _screenshot(html, tmp_path / "report.png", tmp_path)
    assert _pixels(tmp_path / "report.png", PURPLE) > 200  # the timeline's power lane, drawn
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<svg.*?</svg>", "", page, flags=re.S))
    _screenshot(bare, tmp_path / "bare.png", tmp_path)
    assert _pixels(tmp_path / "bare.png", PURPLE) < 50  # without the figures: none of it (the check can fail)
