"""Issue 48 item 1 on a real llama-server: `servedeck serve` (door and watch loop, a process of its own)
at its file-descriptor limit. Before the fix, with the limit lowered to 300 and 400 idle connections
open, the door process exited within ~5 s: the watch loop's `OSError: [Errno 24] Too many open files:
'…/deck.lock'` was re-raised by door/serve.py, and the engines ran on with no door in front of them. Now
the door stops accepting (and says so once, with the limit and what holds the descriptors), serves the
connections it has, and accepts again once they close; it raises its soft limit to the hard one at start."""

from __future__ import annotations

import resource
import socket
import time

import httpx
import psutil
import pytest

from doorkit import ServeProcess, door_config

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

LIMIT = 300
IDLE = 400
CHAT = {"model": "smol", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2}


def status(client: httpx.Client) -> dict:
    return client.get("/door/status").json()["descriptors"]


def test_the_door_at_its_descriptor_limit_pauses_accepting_serves_and_resumes(door_home, engines_ready, tmp_path):
    config = door_config(tmp_path, engines_ready)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # the door inherits a low soft limit...
    try:
        door = ServeProcess(door_home, config, "--watch-interval", "1s")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    idle: list[socket.socket] = []
    try:
        door.wait_up()
        url = f"http://127.0.0.1:{door.port}"
        # one client that keeps its connection (httpx drops an idle one after 5 s by default)
        with httpx.Client(base_url=url, timeout=120, limits=httpx.Limits(keepalive_expiry=300)) as keep:
            assert keep.post("/v1/chat/completions", json=CHAT).status_code == 200  # smollm2 runs
            assert psutil.Process(door.proc.pid).rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)  # ...raised at start
            psutil.Process(door.proc.pid).rlimit(psutil.RLIMIT_NOFILE, (LIMIT, LIMIT))  # prlimit --nofile=300:300
            for _ in range(IDLE):
                idle.append(socket.create_connection(("127.0.0.1", door.port), timeout=10))
            time.sleep(8)  # the watch loop ticks every second: eight passes at the limit
            assert door.proc.poll() is None, f"the door exited at its descriptor limit: {door.proc.stderr.read()}"
            r = keep.post("/v1/chat/completions", json=CHAT)  # a connection it has is still served
            assert r.status_code == 200, r.text
            st = status(keep)
            print(f"at the limit: {st}")
            assert st["limit"] == LIMIT and not st["accepting"] and st["pauses"] == 1, st
            assert st["open"] <= LIMIT and st["client connections"] < IDLE, st
        for s in idle:
            s.close()
        idle.clear()
        deadline = time.monotonic() + 20
        while True:  # new clients are accepted again once the idle connections have gone
            try:
                r = httpx.get(url + "/door/status", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the door did not accept again after the idle clients left"
                time.sleep(0.5)
        assert r.json()["descriptors"]["accepting"], r.json()["descriptors"]
        assert httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=120).status_code == 200
    finally:
        for s in idle:
            s.close()
        rc, err = door.stop()
    print(err[-3000:])
    said = [line for line in err.splitlines() if "stopped accepting connections" in line]
    assert len(said) == 1, err[-3000:]  # once, with the limit and what holds the descriptors
    assert f"of its {LIMIT} file descriptors are open" in said[0] and "client connections" in said[0], said[0]
    assert "engine connections" in said[0] and "accepts again" in said[0], said[0]
    assert "Too many open files" not in err or "watch pass failed" in err, err[-3000:]
