"""Issue 20 item 4, as the issue ran it: `servedeck start smollm2`, `servedeck watch --interval 2s`,
then SIGKILL the supervisor shim (the `pid` of `status --json`). The engine it started lives on,
holding the model's port. The loop must stop that engine and bring the model back under a new
supervisor, answering, within a bounded time, with a notice saying what it did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from servedeck.deck import state as S
from servedeck.supervisor.process import alive, port_holder, start_time_of, stop_group
from servedeck.watch import read_notices
from watchkit import wait_for, with_host

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

BACK_WITHIN_S = 60  # the run: still not back after 90 s; a boot of SmolLM2 here takes a few seconds


def servedeck(cfg, *args: str) -> list[str]:
    return [sys.executable, "-m", "servedeck", "--config", str(cfg.path), *args]


def test_the_loop_replaces_an_engine_whose_shim_was_killed(deck_config):
    cfg = with_host(deck_config, relaunch_spacing_s=2.0, liveness_interval_s=60.0)
    r = subprocess.run(servedeck(cfg, "start", "smollm2"), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    [st] = json.loads(subprocess.run(servedeck(cfg, "status", "--json"), capture_output=True, text=True,
                                     timeout=60).stdout)
    shim, engine, port = st["pid"], st["engine_pid"], st["port"]
    shim_born = start_time_of(shim)  # its number may be another process's by the end
    watch = subprocess.Popen(servedeck(cfg, "watch", "--interval", "2s"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(n["kind"] == "adopted" for n in read_notices()), 30, what="the loop to adopt smollm2")
        os.kill(shim, signal.SIGKILL)
        t0 = time.monotonic()

        def back_under_a_new_shim():
            rec = S.read_live("smollm2")
            return rec if rec and rec.pid != shim and rec.state == "ready" and alive(rec.pid, rec.create_time) else None

        new = wait_for(back_under_a_new_shim, BACK_WITHIN_S, step=0.2, what="smollm2 ready under a new shim")
        print(f"smollm2 back under a new shim {time.monotonic() - t0:.1f} s after its shim was killed")
        answer = httpx.post(new.base_url + "/v1/completions", timeout=60,
                            json={"model": "smollm2", "prompt": "1, 2, 3,", "max_tokens": 3})
        assert answer.status_code == 200
        assert not alive(engine)
        assert port_holder(port)["pgid"] == new.pgid  # the port is the new engine's
        [crashed] = [n for n in read_notices(model="smollm2") if n["kind"] == "crashed"]
        assert f"pid {engine}" in crashed["message"] and "stopped" in crashed["message"]
    finally:
        watch.send_signal(signal.SIGTERM)
        try:
            watch.wait(30)
        finally:
            if watch.poll() is None:
                watch.kill()
        # before the fix the engine outlives everything: never leave it running
        stop_group(shim, 5, leader_create_time=shim_born)
