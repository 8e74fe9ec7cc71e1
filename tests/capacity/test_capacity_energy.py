"""Capacity results carry the energy at the capacity point: a search on a real llama-server (SmolLM2,
tiny loads), its GPU readings a RECORDED reading from an H200 (tests/data/nvml-h200-2026-12-01/
nvml-reader.jsonl, scripts/_nvml_energy_reader.py's capture during scripts/gpu-energy.sh), replayed
through SERVEDECK_TELEMETRY_GPU_REPLAY: this machine has no GPU. The expected joules are rebuilt from
the run folder's own telemetry.jsonl and requests.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servedeck.workloads.points import BenchSpec
from servedeck.workloads.capacity import SEARCH_FILE, CapacitySpec
from servedeck.workloads.session import run as capacity
from servedeck.workloads.search import Resolution
from servedeck.workloads.session import Outcome, measured
from servedeck.fsio import read_jsonl
from servedeck.loadgen import RequestRecord
from servedeck.loadgen.loop import run as run_loop
from servedeck.runs import load
from servedeck.slo import parse_slo
from servedeck.telemetry.figures import of_point

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

CAPTURE = Path(__file__).parents[1] / "data" / "nvml-h200-2026-12-01" / "nvml-reader.jsonl"
POINT = dict(workload="chat", input_tokens=64, output_tokens=4, requests=4, warmup=1)


@pytest.fixture(scope="module")
def search_run(capacity_config, capacity_home, llama, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(capacity_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp_path_factory.mktemp("capacity-energy-results")))
        mp.setenv("SERVEDECK_TELEMETRY_GPU_REPLAY", str(CAPTURE))
        cspec = CapacitySpec(find="max-concurrency", slo=parse_slo("error_rate<=0%"),
                             bench=BenchSpec(shapes=(), **POINT), max_load=2, resolution=Resolution(absolute=1))
        out = Outcome()
        with measured(capacity_config, "smollm2", False, out) as target:
            run_loop(capacity(target, cspec, gate_mode=False, outcome=out))
        return out.folder, json.loads((out.folder / SEARCH_FILE).read_text()), load(out.folder)


def rebuilt_gpu(folder: Path, view: dict, index: int) -> dict:
    point = next(p for p in view["points"] if p["index"] == index)
    records = [RequestRecord.from_json({k: v for k, v in ln.items() if k != "point"})
               for ln in read_jsonl(folder / "requests.jsonl") if ln.get("point") == index]
    return of_point(folder, point, records)["gpu"]


def test_every_step_carries_the_energy_its_telemetry_rebuilds_to(search_run):
    folder, doc, view = search_run
    for s in doc["steps"]:
        gpu = rebuilt_gpu(folder, view, s["judged"]["point"])
        assert s["judged"]["energy"]["j_per_output_token"] == pytest.approx(gpu["j_per_output_token"]), s["load"]


def test_the_capacity_headline_has_j_per_output_token_at_the_capacity_point(search_run):
    folder, doc, view = search_run
    cap = view["capacity"]
    assert cap["capacity"] is not None
    gpu = rebuilt_gpu(folder, view, cap["point"])
    assert cap["j_per_output_token"] == pytest.approx(gpu["j_per_output_token"])


def test_the_headline_says_where_the_joules_came_from(search_run):
    _, _, view = search_run
    assert view["capacity"]["energy_source"] == "energy counter"  # the capture holds the H200's counter


def test_the_reports_capacity_section_names_the_energy_at_capacity(search_run):
    from servedeck.report.capacity import run_section

    _, _, view = search_run
    text = "\n".join(run_section(view))
    assert f"{view['capacity']['j_per_output_token']:.4g} J per output token (energy counter)" in text


def test_the_reports_capacity_section_names_the_mean_power_at_capacity(search_run):
    from servedeck.report.capacity import run_section

    folder, _, view = search_run
    gpu = rebuilt_gpu(folder, view, view["capacity"]["point"])
    assert f"mean power {gpu['mean_power_w']:.0f} W." in "\n".join(run_section(view))
