"""The door's page and /door/status show the GPUs' power, limit and memory, read by the telemetry
sampler's source in the door's own thread. This machine has no GPU: the readings are a RECORDED
reading from an H200 (tests/data/nvml-h200-2026-12-01/nvml-reader.jsonl, written by
scripts/_nvml_energy_reader.py during scripts/gpu-energy.sh on 2026-12-01), replayed through
SERVEDECK_TELEMETRY_GPU_REPLAY. The door here starts no engine: no request asks for a model."""

from __future__ import annotations

import asyncio
import threading
import os
import time
from pathlib import Path

import httpx
import pytest

from servedeck.door import ServeOptions
from servedeck.door.gpu_watch import GpuWatch
from servedeck.modelsfile import load
from servedeck.telemetry.nvml_source import GpuUnavailable, capture_readings

from doorkit import DoorThread, door_config, stop_everything

CAPTURE = Path(__file__).parents[1] / "data" / "nvml-h200-2026-12-01" / "nvml-reader.jsonl"
READINGS = capture_readings(CAPTURE)
POWERS_W = {r["power_mw"] / 1000 for r in READINGS}
LIMIT_W = max(r["limit_mw"] for r in READINGS) / 1000


@pytest.fixture(scope="module")
def gpu_door(door_home, engines_ready, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SERVEDECK_TELEMETRY_GPU_REPLAY", str(CAPTURE))
    cfg = load(door_config(tmp_path_factory.mktemp("door-cfg"), engines_ready))
    d = DoorThread(cfg, ServeOptions(port=0, watch_interval_s=1.0))
    d.client = httpx.Client(base_url=d.url, timeout=30)
    yield d
    d.client.close()
    d.close()
    mp.undo()
    stop_everything(door_home)


def gpu_rows(door, timeout_s: float = 15) -> list[dict]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        rows = door.client.get("/door/status").json()["gpu"].get("gpus")
        if rows:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"/door/status showed no GPU row in {timeout_s} s: {door.client.get('/door/status').json()['gpu']}")


def test_status_shows_the_replayed_gpu_power_against_its_limit(gpu_door):
    row = gpu_rows(gpu_door)[0]
    assert row["gpu"] == READINGS[0]["gpu"]
    assert row["power_w"] in POWERS_W
    assert row["limit_w"] == LIMIT_W
    assert row["share_of_limit"] == round(row["power_w"] / LIMIT_W, 4)


def test_status_memory_is_empty_where_the_capture_holds_none(gpu_door):
    row = gpu_rows(gpu_door)[0]
    assert "mem_used" not in READINGS[0] and row["mem_used"] is None


def test_the_page_in_chromium_shows_the_gpu_row(gpu_door):
    from cdp import Browser

    gpu_rows(gpu_door)
    b = Browser(dict(os.environ))

    async def run() -> list[str]:
        try:
            await b.open(gpu_door.url + "/")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20:
                cells = await b.eval("Array.from(document.querySelectorAll('#gpus tbody tr:first-child td'))"
                                     ".map(td => td.textContent)")
                if cells:
                    return cells
                await asyncio.sleep(0.1)
            return []
        finally:
            await b.close()

    try:
        cells = asyncio.run(run())
    finally:
        b.kill()
    assert cells, "the page drew no GPU row in 20 s"
    assert float(cells[1]) in POWERS_W and float(cells[2]) == LIMIT_W
    assert b.errors == [], b.errors


def test_no_gpu_readable_says_so_and_why(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-capture.jsonl"
    monkeypatch.setenv("SERVEDECK_TELEMETRY_GPU_REPLAY", str(missing))
    w = GpuWatch()
    try:
        w.now()
        t0 = time.monotonic()
        while "not_sampled" not in w.now() and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        note = w.now().get("not_sampled", "")
    finally:
        w.close()
    assert note.startswith("no GPU sampled: ") and str(missing) in note


def test_before_the_first_reading_the_status_says_it_is_pending():
    # seen on the H200 (docs/gpu-runs/h200-capacity-door-2026-12-01/door-status.json): the first
    # /door/status after the door started answered an empty list of GPUs with no word why
    opened = threading.Event()

    class Slow:
        def open(self, gpus):
            opened.wait(10)
            raise GpuUnavailable("test source: closed")

        def close(self):
            pass

    w = GpuWatch(source=Slow())
    try:
        first = w.now()
    finally:
        opened.set()
        w.close()
    assert first["gpus"] == [] and first["pending"].startswith("the first reading is being taken")
