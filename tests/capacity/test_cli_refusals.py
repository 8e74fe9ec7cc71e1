"""`servedeck bench --find`: a mistake in the search's options is refused before anything launches,
naming the part (exit 2, no traceback). No server runs: each is refused before models.toml is opened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


@pytest.mark.parametrize("args, message", [
    (["--find", "max-concurrency"], "--find max-concurrency needs --slo"),
    (["--find", "max-rate", "--slo", "ttfx_p95<=2s"], "unknown figure 'ttfx' (expected one of ttft, tpot, itl, e2e"),
    (["--find", "max-concurrency", "--slo", "ttft_p100<=2s"], "percentile '100' is outside (0, 100)"),
    (["--find", "max-concurrency", "--slo", "tpot_p95<=50"], "the limit '50' has no unit (expected ms, s or m)"),
    (["--find", "max-concurrency", "--slo", "ttft_p95<=2s", "--resolution", "0%"], "--resolution: '0%' must be above 0"),
    (["--find", "max-concurrency", "--slo", "ttft_p95<=2s", "--concurrency", "1,2"], "--find chooses the loads itself"),
    (["--max", "8"], "--max and --resolution bound a capacity search"),
])
def test_search_option_mistakes_exit_2_naming_the_part(tmp_path, args, message):
    r = subprocess.run([SERVEDECK, "--config", str(tmp_path / "none.toml"), "bench", "smollm2", *args],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr
