"""The door with `sleep = "auto"` on models whose engine cannot sleep (llama.cpp, real llama-server):
one user alternating SmolLM2 and Gemma in one slot still gets each answer after a cold switch, and
x-servedeck-waited, the door's swap list and its notices say that the holder was stopped cold and why.
(A switch that really sleeps runs on vLLM on a GPU: bench/sleep_switch.py.)"""

from __future__ import annotations

import re
import time

import httpx
import pytest

from doorkit import DoorThread, door_config, stop_everything
from servedeck.door import ServeOptions
from servedeck.modelsfile import load
from servedeck.watch import read_notices

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

CHAT = [{"role": "user", "content": "Say hello."}]
COLD = "switch (cold: {} cannot sleep: engine 'llamacpp' has no sleep mode)"


@pytest.fixture(scope="module")
def door(door_home, engines_ready, tmp_path_factory):
    path = door_config(tmp_path_factory.mktemp("door-cfg"), engines_ready, min_residency_s=0)
    text = path.read_text()
    for name in ("smollm2", "gemma"):
        text = text.replace(f"[models.{name}]\n", f'[models.{name}]\nsleep = "auto"\n')
    text = text.replace('[models.smol-side]\n', '[models.smol-side]\nsleep = "auto"\nttl_sleep = "1s"\n')  # its ttl: 3s
    path.write_text(text)
    d = DoorThread(load(path), ServeOptions(port=0, watch_interval_s=1.0))
    d.client = httpx.Client(base_url=d.url, timeout=180)
    yield d
    d.client.close()
    d.close()
    stop_everything(door_home)


def chat(door, model: str) -> httpx.Response:
    return door.client.post("/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": 4})


def test_alternating_two_models_that_cannot_sleep_switches_cold_and_says_so(door):
    first = chat(door, "smol")
    assert first.status_code == 200 and re.fullmatch(r"\d+\.\ds start", first.headers["x-servedeck-waited"])
    for model, holder in (("gemma", "smollm2"), ("smol", "gemma"), ("gemma", "smollm2")):
        r = chat(door, model)
        assert r.status_code == 200, r.text
        waited = r.headers["x-servedeck-waited"]
        assert re.fullmatch(r"\d+\.\ds " + re.escape(COLD.format(holder)), waited), waited
    swap = door.client.get("/door/status").json()["swaps"][0]  # newest first
    assert swap["model"] == "gemma" and swap["kind"] == "switch" and swap["slept"] == {}
    assert swap["stopped_cold"] == {"smollm2": "smollm2 cannot sleep: engine 'llamacpp' has no sleep mode"}
    models = {m["id"]: m["servedeck"]["state"] for m in door.client.get("/v1/models").json()["data"]}
    assert models["smollm2"] == "stopped" and models["gemma"] == "ready"


def test_ttl_sleep_on_a_model_that_cannot_sleep_is_refused_once_and_ttl_still_stops_it(door):
    """smol-side: sleep = "auto", ttl_sleep = 1s, ttl = 3s. After 1 s idle the door asks the deck to put it
    to sleep; llama.cpp cannot, so that is said once (not every second), and at 3 s ttl stops it."""
    r = door.client.post("/v1/completions", json={"model": "smol-side", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    state = None
    while time.monotonic() < deadline:
        state = {m["id"]: m["servedeck"]["state"] for m in door.client.get("/v1/models").json()["data"]}["smol-side"]
        if state == "stopped":
            break
        time.sleep(0.2)
    assert state == "stopped"
    kinds = [n["kind"] for n in read_notices(model="smol-side")]
    refused = [n for n in read_notices(model="smol-side") if n["kind"] == "door-sleep-refused"]
    assert len(refused) == 1, kinds
    assert "cannot put smol-side to sleep: engine 'llamacpp' has no sleep mode" in refused[0]["message"]
    assert "door-unload" in kinds and kinds.index("door-sleep-refused") < kinds.index("door-unload")
