"""Runs that end badly still leave their folder: the engine SIGKILLed mid-bench, and Ctrl-C.

Both run the real CLI in a subprocess with --launch on a throwaway llama.cpp model (`victim`), so
the shared servers are never touched and the launched engine must be gone afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servedeck.deck import state as S
from servedeck.fsio import read_jsonl
from servedeck.runs import load
from servedeck.supervisor.process import group_members

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def _start_bench(cfg_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "servedeck", "--config", str(cfg_path), "bench", "victim", "--launch",
           "--no-gate", "--concurrency", "2", "--requests", "60", "--input-tokens", "128",
           "--output-tokens", "64", "--warmup", "0"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def _wait_for_requests(n: int, timeout_s: float = 600) -> Path:
    runs = Path(os.environ["SERVEDECK_RESULTS"]) / "runs"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for folder in runs.glob("victim__*"):
            lines = read_jsonl(folder / "requests.jsonl")
            if sum(ln.get("status") == "ok" for ln in lines) >= n:
                return folder
        time.sleep(0.2)
    raise AssertionError(f"no run folder with {n} finished requests after {timeout_s} s")


def test_engine_killed_mid_bench_leaves_a_failed_folder_with_every_finished_request(campaign_config):
    proc = _start_bench(campaign_config.path)
    try:
        folder = _wait_for_requests(3)
        rec = S.read_live("victim")
        assert rec is not None
        os.kill(rec.engine_pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 7, (out, err)  # RunError
    assert "died" in err and "SIGKILL" in err, err
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "failed" and "SIGKILL" in summary["reason"], summary["reason"]
    assert summary["points"][0]["status"] == "failed"
    lines = read_jsonl(folder / "requests.jsonl")
    ok = [ln for ln in lines if ln["status"] == "ok"]
    assert len(ok) >= 3 and all(ln["output_tokens"] == 64 for ln in ok)
    view = load(folder)
    assert view["status"] == "failed" and view["label"].startswith("FAILED")
    assert view["points"][0]["figures"]["counts"]["ok"] == len(ok)  # every finished request counts
    assert "RUN FAILED" in (folder / "summary.md").read_text()
    assert (folder / "server.log").exists() and (folder / "cmd.sh").exists()
    assert S.read_live("victim") is None and not group_members(rec.pgid)


def test_ctrl_c_mid_bench_keeps_the_folder_and_stops_the_launched_engine(campaign_config):
    proc = _start_bench(campaign_config.path)
    try:
        folder = _wait_for_requests(2)
        rec = S.read_live("victim")
        assert rec is not None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert str(folder) in err
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"].startswith("interrupted")
    assert summary["points"][0]["status"] == "interrupted"
    lines = read_jsonl(folder / "requests.jsonl")
    assert sum(ln["status"] == "ok" for ln in lines) >= 2
    assert all(ln["status"] in ("ok", "cancelled") for ln in lines)
    assert load(folder)["status"] == "failed"
    assert S.read_live("victim") is None and not group_members(rec.pgid)  # --launch: stopped on the way out
