"""The GPU sampler and the energy figures on RECORDED NVML readings: this machine has no GPU.

The readings below are written in NVML's own units (mW, mJ, bytes, %, MHz, the clock-event reason
bitmask) with values of the order ENGINES.md records for one H200 under llama.cpp (about 570 W at one
stream, a 700 W enforced limit, the software power cap set during prefill bursts). They are not a
capture; scripts/gpu-energy.sh runs the same sampler on the H200 through pynvml and checks its energy
against a separate reader of the NVML counter."""

from __future__ import annotations

import threading
import time

import pytest

from servedeck.errors import UsageError
from servedeck.fsio import read_jsonl
from servedeck.loadgen.records import RequestRecord
from servedeck.telemetry.figures import gpu_figures, point_telemetry
from servedeck.telemetry.nvml_source import GpuUnavailable, RecordedSource
from servedeck.telemetry.sampler import PointSampler, Settings


def reading(power_mw: int, energy_mj: int, reasons: int = 0) -> dict:
    return {"gpu": 0, "power_mw": power_mw, "energy_mj": energy_mj, "limit_mw": 700_000,
            "mem_used": 30 * 2**30, "mem_total": 141 * 2**30, "sm_util": 86, "mem_util": 40,
            "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "reasons": reasons, "temp_c": 51}


def test_sampler_writes_gpu_lines_in_servedecks_units(tmp_path):
    src = RecordedSource([reading(572_300, 1_000_000_000, reasons=0x4), {"gpu": 0, "xid": 79}])
    s = PointSampler(tmp_path / "telemetry.jsonl", 3, engine=None, gpu_source=src, gpus=None,
                     settings=Settings(gpu_interval_s=0.05))
    s.start()
    time.sleep(0.3)
    facts = s.stop()
    lines = read_jsonl(tmp_path / "telemetry.jsonl")
    first = next(ln for ln in lines if ln["kind"] == "sample")
    assert first["point"] == 3 and first["gpu"] == 0
    assert first["power_w"] == 572.3 and first["energy_j"] == 1_000_000.0 and first["limit_w"] == 700.0
    assert first["throttle"] == ["sw_power_cap"]
    assert [ln["xid"] for ln in lines if ln["kind"] == "xid"] == [79]
    assert facts["gpu"]["samples"] >= 2
    end = next(ln for ln in lines if ln["kind"] == "end")
    assert end["samples"] == facts["gpu"]["samples"]


def test_recorded_source_without_the_launch_gpu_is_unavailable_and_says_which(tmp_path):
    src = RecordedSource([reading(100_000, 0)])
    with pytest.raises(GpuUnavailable, match=r"hold GPU\(s\) \[0\], not \[1\]"):
        src.open([1])
    s = PointSampler(tmp_path / "t.jsonl", 0, engine=None, gpu_source=src, gpus=[1], settings=Settings())
    s.start()
    facts = s.stop()
    assert "not [1]" in facts["not_sampled"]["gpu"]
    assert [ln["kind"] for ln in read_jsonl(tmp_path / "t.jsonl")] == ["unavailable"]


class SlowSource(RecordedSource):
    """Readings that take longer than the sampling interval: the sampler must fall behind, say so and go on."""

    def read(self, index: int) -> dict:
        time.sleep(0.12)
        return super().read(index)


def test_a_sampler_that_falls_behind_counts_missed_samples(tmp_path):
    s = PointSampler(tmp_path / "t.jsonl", 0, engine=None, gpu_source=SlowSource([reading(300_000, 0)]), gpus=None,
                     settings=Settings(gpu_interval_s=0.05))
    s.start()
    time.sleep(0.6)
    facts = s.stop()
    assert facts["gpu"]["missed"] >= 1
    assert facts["gpu"]["samples"] >= 1
    fig = gpu_figures(read_jsonl(tmp_path / "t.jsonl"), None)
    assert fig["missed"] == facts["gpu"]["missed"]  # said in the point's figures, from the file


def test_sampling_runs_off_the_callers_thread(tmp_path):
    seen: list[int] = []

    class Where(RecordedSource):
        def read(self, index: int) -> dict:
            seen.append(threading.get_ident())
            return super().read(index)

    s = PointSampler(tmp_path / "t.jsonl", 0, engine=None, gpu_source=Where([reading(1, 0)]), gpus=None,
                     settings=Settings(gpu_interval_s=0.05))
    s.start()
    time.sleep(0.2)
    s.stop()
    assert seen and threading.get_ident() not in seen


# --- the figures, from lines written by hand on a known clock ----------------------------------------

def gpu_sample(t: float, power_w: float, energy_j: float | None, gpu: int = 0) -> dict:
    return {"t": t, "point": 0, "source": "gpu", "kind": "sample", "gpu": gpu, "power_w": power_w,
            "energy_j": energy_j, "limit_w": 700.0, "throttle": []}


def point_over(t0: float, start: float, end: float) -> dict:
    return {"index": 0, "load": {"t0_perf_counter": t0, "measured_start": start, "measured_end": end}}


def test_energy_from_the_counter_read_at_the_window_edges():
    # counter: 400 J per second from t=100, sampled every 0.5 s; the window 101.6 .. 103.4 (t0 100 +
    # 1.6 .. 3.4) falls between samples at both edges → 1.8 s × 400 W = 720 J
    lines = [gpu_sample(100.0 + k * 0.5, 400.0, 10_000.0 + 200.0 * k) for k in range(10)]
    recs = [RequestRecord(id=f"r{i}", kind="measured", t_target=1.6, t_send=1.6, t_end=3.4, output_tokens=100,
                          status="ok") for i in range(4)]
    fig = point_telemetry(lines, point_over(100.0, 1.6, 3.4), recs)["gpu"]
    assert fig["energy_source"] == "energy counter"
    assert fig["energy_j"] == pytest.approx(720.0)
    assert fig["j_per_output_token"] == pytest.approx(1.8)
    assert fig["j_per_request"] == pytest.approx(180.0)
    assert fig["output_tokens_per_j"] == pytest.approx(400 / 720)
    assert fig["mean_power_w"] == pytest.approx(400.0) and fig["max_share_of_limit"] == pytest.approx(400 / 700)


def test_without_a_counter_energy_is_integrated_power_and_labelled_so():
    # power rising 100 W per second, sampled every 0.25 s; window 1.1 .. 3.1 s → ∫ = 100 × (3.1² − 1.1²) / 2
    lines = [gpu_sample(10.0 + k * 0.25, 100.0 * k * 0.25, None) for k in range(20)]
    fig = point_telemetry(lines, point_over(10.0, 1.1, 3.1), [])["gpu"]
    assert fig["energy_source"] == "integrated power"
    assert fig["energy_j"] == pytest.approx(100.0 * (3.1**2 - 1.1**2) / 2)
    assert fig["j_per_output_token"] is None  # no output tokens: no figure rather than a division by zero


def test_two_gpus_add_up():
    lines = [gpu_sample(k * 0.5, 100.0, 50.0 * k, gpu=0) for k in range(10)] + \
            [gpu_sample(k * 0.5, 200.0, 100.0 * k, gpu=1) for k in range(10)]
    fig = point_telemetry(lines, point_over(0.0, 1.0, 3.0), [])["gpu"]
    assert fig["energy_j"] == pytest.approx(200.0 + 400.0)
    assert [g["gpu"] for g in fig["gpus"]] == [0, 1]


def test_interval_settings_are_checked_and_name_the_variable(monkeypatch):
    monkeypatch.setenv("SERVEDECK_TELEMETRY_GPU_S", "fast")
    with pytest.raises(UsageError, match="SERVEDECK_TELEMETRY_GPU_S='fast'"):
        Settings.from_env()
    monkeypatch.setenv("SERVEDECK_TELEMETRY_GPU_S", "0.001")
    with pytest.raises(UsageError, match="between 0.05 and 10"):
        Settings.from_env()
    monkeypatch.setenv("SERVEDECK_TELEMETRY_GPU_S", "0.1")
    monkeypatch.setenv("SERVEDECK_TELEMETRY", "off")
    assert Settings.from_env() == Settings(enabled=False, engine_interval_s=1.0, gpu_interval_s=0.1)
