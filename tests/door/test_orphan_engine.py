"""Issue 20 item 4 through the door: `servedeck serve` runs the watch loop in-process. A model started
on demand by a request, then its supervisor shim SIGKILLed: the engine it started lives on, holding
the model's port. The model must come back under a new supervisor and answer through the door, and
the engine the shim left must be gone, with a notice saying what was done."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from servedeck.deck import state as S
from servedeck.door import ServeOptions
from servedeck.modelsfile import load
from servedeck.supervisor.process import alive, stop_group
from servedeck.watch import read_notices

from doorkit import DoorThread, door_config, stop_everything

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}
BACK_WITHIN_S = 60


def test_a_model_whose_shim_was_killed_comes_back_and_answers_through_the_door(door_home, engines_ready, tmp_path):
    path = door_config(tmp_path, engines_ready)
    text = path.read_text()
    assert "relaunch_tries = 0\nrelaunch_spacing_s = 60\n" in text
    path.write_text(text.replace("relaunch_tries = 0\nrelaunch_spacing_s = 60\n",
                                 "relaunch_tries = 3\nrelaunch_spacing_s = 2\n", 1))
    door = DoorThread(load(path), ServeOptions(port=0, watch_interval_s=1.0))
    client = httpx.Client(base_url=door.url, timeout=120)
    old = None
    try:
        first = client.post("/v1/chat/completions", json=CHAT)
        assert first.status_code == 200, first.text[:500]
        old = S.read_live("smollm2")
        os.kill(old.pid, signal.SIGKILL)
        deadline = time.monotonic() + BACK_WITHIN_S
        new = None
        while time.monotonic() < deadline:
            rec = S.read_live("smollm2")
            if rec and rec.pid != old.pid and rec.state == "ready" and alive(rec.pid, rec.create_time):
                new = rec
                break
            time.sleep(0.2)
        assert new is not None, f"smollm2 not ready under a new shim {BACK_WITHIN_S} s after its shim was killed"
        again = client.post("/v1/chat/completions", json=CHAT)
        assert again.status_code == 200, again.text[:500]
        assert not alive(old.engine_pid)
        [crashed] = [n for n in read_notices(model="smollm2") if n["kind"] == "crashed"]
        assert f"pid {old.engine_pid}" in crashed["message"] and "stopped" in crashed["message"]
    finally:
        client.close()
        door.close()
        if old is not None:  # before the fix the engine outlives the door
            stop_group(old.pgid, 5, leader_create_time=old.create_time)
        stop_everything(door_home)
