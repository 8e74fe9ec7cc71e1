"""The front door on real llama-server engines (SmolLM2-135M and Gemma 3 270M), one door for the
module. Tests run in file order and build on each other's state (what runs), as a user session would."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from doorkit import disconnect_mid_stream, engine_metrics, generated_after_disconnect

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

CHAT = [{"role": "user", "content": "Say hello."}]


def states(door) -> dict[str, str]:
    r = door.client.get("/v1/models")
    r.raise_for_status()
    return {m["id"]: m["servedeck"]["state"] for m in r.json()["data"]}


def wait_state(door, model: str, want: str, timeout_s: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if states(door)[model] == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"{model} not {want} after {timeout_s} s: {states(door)}")


def stream_chat(door, model: str, max_tokens: int = 8, ignore_eos: bool = False) -> tuple[int, list[bytes]]:
    body = {"model": model, "messages": CHAT, "max_tokens": max_tokens, "stream": True, "ignore_eos": ignore_eos}
    with door.client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [c for c in r.iter_raw()]
        return r.status_code, chunks


def test_models_lists_names_and_aliases_with_state(door):
    s = states(door)
    for name in ("smollm2", "smol", "SmolLM2-135M-Instruct", "gemma", "gemma3-270m", "smollm2-vllm", "smol-vllm"):
        assert s[name] == "stopped", s
    data = door.client.get("/v1/models").json()["data"]
    alias = next(m for m in data if m["id"] == "smol")
    assert alias["servedeck"]["alias_of"] == "smollm2" and alias["object"] == "model"


def test_unknown_model_and_missing_model_are_named(door):
    r = door.client.post("/v1/chat/completions", json={"model": "nope", "messages": CHAT})
    assert r.status_code == 404 and "'nope'" in r.json()["error"]["message"]
    r = door.client.post("/v1/chat/completions", json={"messages": CHAT})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]


def test_a_chat_for_a_stopped_model_starts_it_and_streams(door):
    status, chunks = stream_chat(door, "smol")  # an alias
    body = b"".join(chunks)
    assert status == 200, body[:500]
    assert body.count(b"data: ") >= 3 and b"[DONE]" in body
    assert states(door)["smollm2"] == "ready"
    live = json.loads((door.home / "live" / "smollm2.json").read_text())
    assert live["state"] == "ready"


def test_a_client_that_expects_100_continue_gets_the_stream(door):
    """curl sends `Expect: 100-continue` for a body over 1 KiB and waits for the interim answer; the
    door gives it, and the engine's own answer still reaches the client whole."""
    import socket

    body = json.dumps({"model": "smollm2", "max_tokens": 4, "stream": True,
                       "messages": [{"role": "user", "content": "Say hello. " + "x" * 1500}]}).encode()
    host, port = door.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200 "), got[:300]
    assert b"[DONE]" in got and got.endswith(b"0\r\n\r\n") and b"100 Continue" not in got


def test_another_model_of_the_slot_switches_and_queued_requests_all_complete(door):
    """Requests for gemma arrive while smollm2 streams: the switch waits for the smollm2 streams to
    finish (drain), the gemma requests queue during the switch, and every request completes."""
    wait_state(door, "smollm2", "ready")
    with cf.ThreadPoolExecutor(8) as pool:
        old = [pool.submit(stream_chat, door, "smollm2", 6, True) for _ in range(2)]
        time.sleep(0.3)
        new = [pool.submit(stream_chat, door, "gemma3-270m", 8) for _ in range(4)]
        seen = set()
        while not all(f.done() for f in new):
            seen.add(states(door)["smollm2"])
            time.sleep(0.05)
        results = [f.result() for f in old + new]
    assert [s for s, _ in results] == [200] * 6
    assert all(b"[DONE]" in b"".join(c) for _, c in results)
    assert "draining" in seen or "stopping" in seen, seen
    s = states(door)
    assert s["gemma"] == "ready" and s["smollm2"] == "stopped"


def test_a_client_disconnect_stops_the_engine_generating(door):
    wait_state(door, "gemma", "ready")
    port = door.cfg.models["gemma"].port
    before = engine_metrics(port)
    disconnect_mid_stream(door.url, "gemma")
    # the engine's own counters: nothing is processing, and the token count stops growing far short of 1500
    generated = generated_after_disconnect(port, "llamacpp:requests_processing", "llamacpp:tokens_predicted_total",
                                           before)
    assert generated < 400, f"{generated} tokens generated after a disconnect at ~5"
    slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=10).json()
    assert not any(s.get("is_processing") for s in slots)


def test_a_failed_boot_is_502_with_its_cause_and_not_retried_at_once(door):
    r = door.client.post("/v1/chat/completions", json={"model": "broken", "messages": CHAT})
    assert r.status_code == 502, r.text
    err = r.json()["error"]
    assert "broken failed to start" in err["message"]
    assert int(r.headers["Retry-After"]) > 30
    t0 = time.monotonic()
    r2 = door.client.post("/v1/chat/completions", json={"model": "broken", "messages": CHAT})
    assert r2.status_code == 502 and time.monotonic() - t0 < 1.0  # answered from the standing refusal
    assert states(door)["broken"] == "failed"


def test_a_model_that_cannot_fit_gets_503_naming_the_holder(door, monkeypatch):
    """NVML is faked the way tests/gpu does it: an Inventory built by hand in which the real gemma
    engine's pid holds nearly all of an H200. The deck's own fit check refuses; the door says who."""
    from servedeck.gpu.nvml import Gpu, GpuProcess, Inventory

    wait_state(door, "gemma", "ready")
    live = json.loads((door.home / "live" / "gemma.json").read_text())
    GiB = 1024**3
    total, held = 141 * GiB, 141 * GiB - 50 * 1024**2
    inv = Inventory(available=True, driver_version="570.0", gpus=(Gpu(
        index=0, name="NVIDIA H200", uuid="GPU-0", pci_bus_id="0000:01:00.0", memory_total=total,
        memory_used=held, memory_free=total - held, processes=(GpuProcess(live["engine_pid"] or live["pid"], held),)),))
    # the deck's start reads NVML once through servedeck.gpu.inventory (the fit check and the PCI ids of
    # the crash record share it); the fit module's own default is faked too for any path that uses it
    monkeypatch.setattr("servedeck.gpu.inventory", lambda: inv)
    monkeypatch.setattr("servedeck.gpu.fit.inventory", lambda: inv)
    r = door.client.post("/v1/chat/completions", json={"model": "gemma-side", "messages": CHAT})
    assert r.status_code == 503, r.text
    msg = r.json()["error"]["message"]
    assert "gemma on GPU 0 holds" in msg and "does not fit" in msg
    assert int(r.headers["Retry-After"]) >= 1
    assert states(door)["gemma-side"] == "stopped"


def test_ttl_unloads_an_idle_model(door):
    status, _ = stream_chat(door, "smol-side")
    assert status == 200
    assert states(door)["smol-side"] == "ready"
    wait_state(door, "smol-side", "stopped", timeout_s=20)  # ttl = 3 s
    assert not (door.home / "live" / "smol-side.json").exists()


def test_a_replicated_model_starts_every_replica_and_spreads_requests(door):
    """models.toml `replicas = 2`: one name at the door, two llama-servers (each pinned to its own
    CPU); concurrent requests go to the replica with the fewest outstanding, so both serve (their own
    counters say so); ttl unloads both."""
    assert "smol-pair.r1" not in states(door)  # the replicas are served under the entry's name
    status, _ = stream_chat(door, "pair")  # starts both replicas
    assert status == 200
    recs = {r: json.loads((door.home / "live" / f"smol-pair.r{r}.json").read_text()) for r in (1, 2)}
    assert recs[1]["port"] + 1 == recs[2]["port"] and recs[1]["pgid"] != recs[2]["pgid"]
    assert recs[1]["state"] == recs[2]["state"] == "ready"
    before = {r: engine_metrics(recs[r]["port"]).get("llamacpp:tokens_predicted_total", 0) for r in (1, 2)}
    with cf.ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda _: stream_chat(door, "smol-pair", max_tokens=24, ignore_eos=True), range(6)))
    assert [s for s, _ in outs] == [200] * 6
    grew = {r: engine_metrics(recs[r]["port"])["llamacpp:tokens_predicted_total"] - before[r] for r in (1, 2)}
    assert grew[1] >= 24 and grew[2] >= 24, f"both replicas must serve: tokens predicted {grew}"
    # 6 x 24 tokens, plus at most the watch loop's first liveness probe of each new replica (1 token each)
    assert 6 * 24 <= sum(grew.values()) <= 6 * 24 + 2, grew
    snap = next(m for m in door.client.get("/door/status").json()["models"] if m["model"] == "smol-pair")
    assert snap["members"] == ["smol-pair.r1", "smol-pair.r2"] and len(snap["replicas"]) == 2
    wait_state(door, "smol-pair", "stopped", timeout_s=30)  # ttl = 4 s
    from servedeck.supervisor.process import group_members
    assert not group_members(recs[1]["pgid"]) and not group_members(recs[2]["pgid"])


def test_metrics_parse_and_count_what_happened(door):
    text = door.client.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    req = {(s.labels["model"], s.labels["status"]): s.value for s in fams["servedeck_door_requests"].samples
           if s.name.endswith("_total")}
    assert req[("smollm2", "200")] >= 3 and req[("gemma", "200")] >= 4
    assert req[("broken", "502")] == 2 and req[("gemma-side", "503")] == 1
    swaps = {s.labels["model"]: s.value for s in fams["servedeck_door_swap_seconds"].samples
             if s.name.endswith("_count")}
    assert swaps["gemma"] >= 1
    boots = {(s.labels["model"], s.labels["outcome"]): s.value for s in fams["servedeck_door_boots"].samples
             if s.name.endswith("_total")}
    assert boots[("broken", "failed")] == 1 and boots[("smollm2", "ok")] >= 1
    ttft = {s.labels["model"]: s.value for s in fams["servedeck_door_ttft_seconds"].samples
            if s.name.endswith("_count")}
    assert ttft["gemma"] >= 4
    assert "servedeck_door_queue_depth" in fams and "servedeck_door_inflight" in fams
    unloads = {s.labels["model"]: s.value for s in fams["servedeck_door_ttl_unloads"].samples
               if s.name.endswith("_total")}
    assert unloads["smol-side"] == 1


def test_status_json_and_the_watch_loop_runs_in_process(door):
    snap = door.client.get("/door/status").json()
    assert {m["model"] for m in snap["models"]} >= {"smollm2", "gemma"}
    kinds = {n["kind"] for n in snap["notices"]}
    assert "started" in kinds and "door-switch-ok" in kinds  # the loop's notice and the door's own


def test_the_live_page_in_chromium_shows_a_model_starting(door):
    """The page loads with no console error or exception, and shows smollm2's state change after a
    request starts it (it was switched out for gemma above)."""
    import asyncio
    import os
    import threading

    from cdp import Browser

    assert states(door)["smollm2"] == "stopped"
    b = Browser(dict(os.environ))

    async def run() -> list[str]:
        await b.open(door.url + "/")
        seen: list[str] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20 and not seen:
            v = await b.eval("(document.getElementById('state-smollm2')||{}).textContent || null")
            if v:
                seen.append(v)
            await asyncio.sleep(0.1)
        assert seen == ["stopped"], seen
        result: dict = {}
        th = threading.Thread(target=lambda: result.update(r=stream_chat(door, "smollm2", 8)))
        th.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 90 and seen[-1] != "ready":
            v = await b.eval("document.getElementById('state-smollm2').textContent")
            if v != seen[-1]:
                seen.append(v)
            await asyncio.sleep(0.1)
        th.join(60)
        assert result["r"][0] == 200
        rows = await b.eval("document.querySelectorAll('#recent tbody tr').length")
        assert rows >= 1
        return seen

    async def main() -> list[str]:
        try:
            return await run()
        finally:
            await b.close()

    try:
        seen = asyncio.run(main())
    finally:
        b.kill()
    assert seen[0] == "stopped" and seen[-1] == "ready" and len(seen) >= 2, seen
    assert b.errors == [], b.errors
