"""models.toml's `routing` at the door on real llama-servers: `session` keeps one conversation on one
replica, whose prompt cache then serves each next turn (issue 25). One door for the module, as in
test_door.py; the decisions themselves are tested without processes in test_policy.py."""

from __future__ import annotations

import httpx
import pytest

from doorkit import DoorThread, door_config, engine_metrics, stop_everything
from ports import free_port_pair
from servedeck.door import ServeOptions
from servedeck.modelsfile import load

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

SYSTEM = "You are a helpful assistant who answers in one short sentence about colours and paint."


@pytest.fixture(scope="module")
def door(door_home, engines_ready, tmp_path_factory):
    path = door_config(tmp_path_factory.mktemp("routing-cfg"), engines_ready)
    path.write_text(path.read_text() + f"""
[models.smol-sess]
source = "{engines_ready['smollm2_gguf']}"
build = "llamacpp"
port = {free_port_pair()}
slot = "sess"
context = 1024
replicas = 2
cpus = [[0], [1]]
routing = {{ policy = "session", header = "x-session-id" }}
""")
    d = DoorThread(load(path), ServeOptions(port=0, watch_interval_s=1.0))
    d.home = door_home
    d.client = httpx.Client(base_url=d.url, timeout=120)
    yield d
    d.client.close()
    d.close()
    stop_everything(door_home)


def turn(door, history: list[dict]) -> dict:
    r = door.client.post("/v1/chat/completions", headers={"x-session-id": "u1"},
                         json={"model": "smol-sess", "messages": history, "max_tokens": 8, "ignore_eos": True})
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    history += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                {"role": "user", "content": "And another one?"}]
    return body


def test_session_routing_keeps_a_conversation_on_one_replica_and_its_cache_serves_each_next_turn(door):
    import json

    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    first = turn(door, history)  # starts both replicas; pins u1 to one of them
    ports = [json.loads((door.home / "live" / f"smol-sess.r{r}.json").read_text())["port"] for r in (1, 2)]
    before = [engine_metrics(p).get("llamacpp:tokens_predicted_total", 0) for p in ports]
    later = [turn(door, history) for _ in range(2)]
    grew = sorted(engine_metrics(p)["llamacpp:tokens_predicted_total"] - b for p, b in zip(ports, before))
    assert grew[1] >= 16, f"the pinned replica predicted both turns' 8 tokens: {grew}"
    assert grew[0] <= 1, f"the other replica served none of them (a liveness probe at most): {grew}"
    cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in later]
    assert cached[0] >= first["usage"]["prompt_tokens"] // 2, (cached, first["usage"])
