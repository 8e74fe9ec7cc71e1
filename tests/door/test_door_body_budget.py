"""Issue 48 item 4 on a real llama-server: `servedeck serve --body-budget-mib 8` (a process of its own)
bounds the request bodies it holds, all clients together. Two large bodies that together pass the
budget: the one that would pass it gets 503 with Retry-After, a request within the budget is still
answered by the engine meanwhile, and once the first large body's answer is written its share of the
budget is free again, so a new large body is accepted. tests/door/test_front_bounds.py holds the same
bookkeeping against a stub front; this is the door a user runs, with the flag a user gives."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from doorkit import ServeProcess, door_config

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

BUDGET_MIB = 8
BIG = 5 * 2**20  # two of these pass the budget, one does not
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 2}


def big_chat() -> bytes:
    """A chat of BIG bytes that llama-server answers as quickly as a small one: the JSON padded with
    whitespace, which every parser skips."""
    text = json.dumps(CHAT).encode()
    return text[:-1] + b" " * (BIG - len(text)) + b"}"


def bodies(url: str) -> dict:
    return httpx.get(url + "/door/status", timeout=30).json()["bodies"]


def head(port: int, length: int) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (port, length))


def read_answer(s: socket.socket) -> tuple[int, bytes]:
    """One whole HTTP/1.1 answer with a Content-Length (the door's own and llama-server's chat)."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        assert got, f"the door closed the connection: {data[:300]!r}"
        data += got
    top, rest = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in top.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        got = s.recv(65536)
        assert got, "the door closed the connection mid-answer"
        rest += got
    return int(top.split(b" ", 2)[1]), rest


def test_two_large_bodies_past_the_budget_one_503_others_answered_budget_released(door_home, engines_ready,
                                                                                  tmp_path):
    config = door_config(tmp_path, engines_ready)
    door = ServeProcess(door_home, config, "--body-budget-mib", str(BUDGET_MIB))
    big = big_chat()
    held: socket.socket | None = None
    try:
        door.wait_up()
        url = f"http://127.0.0.1:{door.port}"
        with httpx.Client(base_url=url, timeout=600) as c:  # the first chat boots smollm2 (minutes when loaded)
            r = c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200, r.text
            assert bodies(url)["budget_mib"] == BUDGET_MIB

            # the first large body: its head and half of it, the rest held back (the door counts the whole
            # Content-Length against the budget from the head on, before a byte of the body is kept)
            held = socket.create_connection(("127.0.0.1", door.port), timeout=120)
            held.sendall(head(door.port, len(big)) + big[:BIG // 2])
            deadline = time.monotonic() + 30
            while bodies(url)["held_mib"] < BIG / 2**20:
                assert time.monotonic() < deadline, f"the door never counted the first body: {bodies(url)}"
                time.sleep(0.2)

            # the second large body would pass the budget: 503 with Retry-After, naming the budget and the flag
            r = c.post("/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
            assert r.status_code == 503, r.text[:300]
            assert r.headers.get("Retry-After") == "2", r.headers
            message = r.json()["error"]["message"]
            assert f"budget is {BUDGET_MIB} MiB" in message and "--body-budget-mib" in message, message

            # a request within the budget is still answered by the engine while the first body is held
            r = c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.json()["choices"], r.text

            # the first large body, finished, is answered by the engine; then its share is free again
            held.sendall(big[BIG // 2:])
            status, answer = read_answer(held)
            assert status == 200 and json.loads(answer)["choices"], answer[:300]
            held.close()
            held = None
            deadline = time.monotonic() + 10
            while bodies(url)["held_mib"] > 0.1:  # the status request itself holds no body
                assert time.monotonic() < deadline, f"the budget was not released: {bodies(url)}"
                time.sleep(0.2)
            r = c.post("/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
            assert r.status_code == 200 and r.json()["choices"], r.text[:300]
            seen = bodies(url)
            print(f"bodies: {seen}")
            assert seen["refused"] == 1, seen
    finally:
        if held is not None:
            held.close()
        rc, err = door.stop()
    assert "Traceback" not in err, err[-3000:]
