"""The session guard (tests/conftest.py) sees what campaign tests leave behind, and fails the session.

A pytest session of its own runs left_running_case.py, where a campaign-style session fixture and a
`servedeck start` CLI subprocess each leave a real llama.cpp engine running. That session must end
failed, name both launches (shim and engine pids), and have stopped them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import TEST_MARK

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

ROOT = Path(__file__).parents[2]
CASE = Path(__file__).with_name("left_running_case.py")


def _of_the_inner_session(session: str, home_under: Path) -> list[psutil.Process]:
    """What the inner session started: by its mark, or (should the mark be missing) by a home under its temp dir."""
    out = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if p.status() != psutil.STATUS_ZOMBIE and (
                    env.get(TEST_MARK) == session or env.get("SERVEDECK_HOME", "").startswith(str(home_under))):
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def test_the_guard_fails_a_session_that_leaves_campaign_engines_running(tmp_path, engines_ready):
    pids = tmp_path / "pids.json"
    env = {**os.environ, "ORPHAN_CASE_PIDS": str(pids), "SERVEDECK_TEST_GUARD_WAIT_S": "3"}
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              f"--basetemp={tmp_path / 'inner'}", str(CASE)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = inner.communicate(timeout=600)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
        left = _of_the_inner_session(str(inner.pid), tmp_path / "inner")  # its mark is its pid
        for p in left:
            try:
                pgid = os.getpgid(p.pid)  # each engine and its shim have a group of their own; never ours
                os.killpg(pgid, 9) if pgid != os.getpgid(0) else p.kill()
            except (OSError, psutil.Error):
                pass
    launched = json.loads(pids.read_text())
    assert sorted(launched) == ["gemma", "victim"], out
    assert inner.returncode == 1, out
    assert "1 passed, 1 error" in out, out  # the case's test passed; the guard's check failed the session
    assert "were still running 3 s after the last test (killed now)" in out, out
    for name, rec in launched.items():
        for role in ("shim", "engine"):
            assert f"pid {rec[role]} " in out, (name, role, out)
    assert not left, [p.pid for p in left]
