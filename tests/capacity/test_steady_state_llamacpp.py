"""A closed loop's steady state on a real llama-server (SmolLM2, 4 slots).

A burst, honestly: 16 streams against 4 slots with a 0.3 s duration: every stream sends once at the start and the
first wave cannot end before the duration does (four rounds of 32-token answers on a CPU), so the point measured
one burst, and says so in summary.json and in what `servedeck bench` prints; `--waves 3` at 4 streams sends three
requests a stream and reaches a steady state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def _cli(cfg_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg_path), *args],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))


@pytest.fixture(scope="module")
def burst(capacity_config, capacity_home, llama, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(capacity_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp_path_factory.mktemp("burst-results")))
        printed = _cli(capacity_config.path, "bench", "smollm2", "--workload", "chat", "--concurrency", "16",
                       "--duration", "0.3s", "--input-tokens", "64", "--output-tokens", "32", "--no-gate")
        waves = _cli(capacity_config.path, "bench", "smollm2", "--workload", "chat", "--concurrency", "4",
                     "--waves", "3", "--input-tokens", "64", "--output-tokens", "8", "--no-gate", "--json")
    return printed, waves


def test_a_too_short_duration_at_high_concurrency_is_called_a_burst(burst, capacity_config):
    printed, _ = burst
    assert printed.returncode == 0, printed.stderr
    assert "measured a single burst" in printed.stdout and "--waves 3" in printed.stdout, printed.stdout
    folder = Path(printed.stderr.strip().splitlines()[-1].split("run folder: ")[-1])
    point = json.loads((folder / "summary.json").read_text())["points"][0]
    st = point["figures"]["steady_state"]
    assert not st["reached"] and st["concurrency"] == 16 and st["after_first_wave"] == 0, st
    assert any("measured a single burst" in w for w in point["figures"]["warnings"])


def test_waves_send_that_many_requests_a_stream_and_reach_a_steady_state(burst):
    _, waves = burst
    assert waves.returncode == 0, waves.stderr
    view = json.loads(waves.stdout)
    fig = view["points"][0]["figures"]
    assert fig["counts"]["measured"] == 12 and view["workload"]["waves"] == 3
    assert fig["steady_state"]["reached"], fig["steady_state"]
    assert not any("burst" in w for w in fig["warnings"])
