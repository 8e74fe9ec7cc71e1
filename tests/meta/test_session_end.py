"""The end of a test session (tests/conftest.py): pytest's summary is the output's last line, and the
run ends with pytest's exit code, even when a test left a thread that would hold the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]
CASE = Path(__file__).with_name("held_at_exit_case.py")


def test_a_thread_left_blocked_cannot_hold_the_run_past_its_summary(tmp_path):
    env = {**os.environ, "SERVEDECK_TEST_EXIT_WAIT_S": "3", "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--basetemp={tmp_path / 'inner'}", str(CASE)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.stdout.strip().splitlines()[-1].startswith("1 passed in "), r.stdout
    assert r.returncode == 0
    assert 'held_at_exit_case.py", line 10 in blocked_forever' in r.stderr  # the stack of what held it
    assert took < 60, f"the inner session took {took:.0f} s"
