"""The GPU sampler and the energy figures on a RECORDED reading from an H200: no GPU here.

tests/data/nvml-h200-2026-12-01/nvml-reader.jsonl is what scripts/_nvml_energy_reader.py (pynvml only,
no servedeck code) wrote every 50 ms on one NVIDIA H200 (700 W enforced limit) while scripts/gpu-energy.sh
ran CUDA llama-server at 1, 8 and 32 streams on 2026-12-01 (docs/telemetry.md, "On the H200"). Its
first line is the reader's clock line, then one raw NVML reading per line: t, gpu, energy_mj, power_mw,
limit_mw. Every expectation below is computed from the file itself."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from servedeck.fsio import read_jsonl
from servedeck.telemetry.figures import gpu_figures
from servedeck.telemetry.live import gpu_source
from servedeck.telemetry.nvml_source import RecordedSource, capture_readings
from servedeck.telemetry.sampler import PointSampler, Settings, gpu_line

CAPTURE = Path(__file__).parents[1] / "data" / "nvml-h200-2026-12-01" / "nvml-reader.jsonl"


def capture_as_lines() -> list[dict]:
    """The capture on its own clock, each reading converted by the sampler's own conversion."""
    return [{"t": r["t"], "source": "gpu", "kind": "sample", "gpu": r["gpu"], **gpu_line(r)}
            for r in capture_readings(CAPTURE)]


def longest_loaded_stretch(lines: list[dict]) -> tuple[int, int]:
    """First and last index of the longest run of readings drawing more than halfway between the
    capture's lowest and highest power: the stretch the load ran longest."""
    power = [ln["power_w"] for ln in lines]
    half = (min(power) + max(power)) / 2
    best, start = (0, -1), None
    for i, p in enumerate(power + [float("-inf")]):
        if p > half and start is None:
            start = i
        elif p <= half and start is not None:
            if i - 1 - start > best[1] - best[0]:
                best = (start, i - 1)
            start = None
    return best


def test_the_h200_capture_replays_through_the_env_var_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_TELEMETRY_GPU_REPLAY", str(CAPTURE))
    src = gpu_source()  # the same env path the sampler and the door take
    readings = capture_readings(CAPTURE)
    s = PointSampler(tmp_path / "telemetry.jsonl", 0, engine=None, gpu_source=src, gpus=None,
                     settings=Settings(gpu_interval_s=0.05))
    s.start()
    time.sleep(0.5)
    s.stop()
    samples = [ln for ln in read_jsonl(tmp_path / "telemetry.jsonl") if ln["kind"] == "sample"]
    played = readings[:len(samples)]
    assert len(samples) >= 3
    assert [ln["power_w"] for ln in samples] == [r["power_mw"] / 1000 for r in played]


def test_replayed_counter_energy_is_the_counter_difference_of_the_readings_played(tmp_path):
    readings = capture_readings(CAPTURE)
    s = PointSampler(tmp_path / "telemetry.jsonl", 0, engine=None, gpu_source=RecordedSource(readings), gpus=None,
                     settings=Settings(gpu_interval_s=0.05))
    s.start()
    time.sleep(0.5)
    s.stop()
    lines = read_jsonl(tmp_path / "telemetry.jsonl")
    samples = [ln for ln in lines if ln["kind"] == "sample"]
    fig = gpu_figures(lines, (samples[0]["t"], samples[-1]["t"]))
    expected = (readings[len(samples) - 1]["energy_mj"] - readings[0]["energy_mj"]) / 1000
    assert fig["energy_j"] == pytest.approx(expected, abs=1e-3)


def test_energy_over_the_loaded_stretch_is_the_counter_difference():
    lines = capture_as_lines()
    a, b = longest_loaded_stretch(lines)
    assert lines[b]["t"] - lines[a]["t"] > 10  # a real load stretch, not a blip
    fig = gpu_figures(lines, (lines[a]["t"], lines[b]["t"]))
    assert fig["energy_source"] == "energy counter"
    assert fig["energy_j"] == pytest.approx(lines[b]["energy_j"] - lines[a]["energy_j"], abs=1e-3)


def test_integrated_power_over_the_loaded_stretch_is_within_3_percent_of_the_counter():
    lines = capture_as_lines()
    a, b = longest_loaded_stretch(lines)
    counter = lines[b]["energy_j"] - lines[a]["energy_j"]
    power_only = [{k: v for k, v in ln.items() if k != "energy_j"} for ln in lines]
    fig = gpu_figures(power_only, (lines[a]["t"], lines[b]["t"]))
    assert fig["energy_source"] == "integrated power"
    assert fig["energy_j"] == pytest.approx(counter, rel=0.03)


def test_share_of_limit_over_the_loaded_stretch_is_against_the_captures_enforced_limit():
    lines = capture_as_lines()
    a, b = longest_loaded_stretch(lines)
    inside = lines[a:b + 1]
    fig = gpu_figures(lines, (lines[a]["t"], lines[b]["t"]))
    assert fig["max_share_of_limit"] == pytest.approx(max(ln["power_w"] for ln in inside)
                                                      / max(ln["limit_w"] for ln in inside))
