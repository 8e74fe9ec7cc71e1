"""One user through the door on real llama-server engines (SmolLM2-135M and Gemma 3 270M, both in slot
`main`), with the default min_residency_s of 30 s: alternating the two models pays the switch and not
the residency, a request that waited says why, and a stream whose engine dies ends with an error event.
One door for the module; the tests run in file order and build on what runs, as a user session would."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from doorkit import DoorThread, door_config, stop_everything
from servedeck.door import ServeOptions
from servedeck.modelsfile import load

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

MIN_RESIDENCY_S = 30  # the default, as a user has it
CHAT = [{"role": "user", "content": "Say hello."}]
PART = r"\d+\.\ds [a-z-]+"  # one reason of x-servedeck-waited: "2.1s switch"


@pytest.fixture(scope="module")
def door(door_home, engines_ready, tmp_path_factory):
    cfg = load(door_config(tmp_path_factory.mktemp("door-cfg"), engines_ready, min_residency_s=MIN_RESIDENCY_S))
    d = DoorThread(cfg, ServeOptions(port=0, watch_interval_s=1.0))
    d.home = door_home
    d.client = httpx.Client(base_url=d.url, timeout=180)
    yield d
    d.client.close()
    d.close()
    stop_everything(door_home)


def chat(door, model: str, max_tokens: int = 4) -> httpx.Response:
    return door.client.post("/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": max_tokens})


def recent(door, model: str) -> dict:
    return next(e for e in door.client.get("/door/status").json()["recent"] if e["model"] == model)


def test_one_user_alternating_two_models_waits_only_for_the_switch(door):
    """smol answers one request, then the same user asks gemma (same slot). smollm2 has nothing in
    flight or queued: no contention, so the door switches at once. Before issue 20's fix the finished
    request counted as traffic and gemma waited until smollm2 had held the slot for 30 s (31.95 s seen,
    for a 1.98 s switch)."""
    assert chat(door, "smol").status_code == 200  # starts smollm2: nothing ran before
    t0 = time.monotonic()
    r = chat(door, "gemma")
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    waited = r.headers["x-servedeck-waited"]
    print(f"gemma answered after {took:.2f} s; x-servedeck-waited: {waited}")
    assert re.fullmatch(r"\d+\.\ds switch", waited), waited
    # Besides the switch (2-3 s on a quiet box, 10 s seen at load 7.5 on 2 cores) gemma's request spent
    # only its 4-token answer's time; the residency would have added ~28 s more.
    switch_s = float(waited.split("s ", 1)[0])
    assert took - switch_s < MIN_RESIDENCY_S / 2, f"gemma answered after {took:.1f} s (waited: {waited})"
    assert recent(door, "gemma")["waited"] == waited  # the page's recent requests say the same


def test_a_request_for_a_contended_slot_waits_out_the_residency_and_says_so(door):
    """gemma has just become ready and streams a request when smol is asked for: the slot is truly
    contended, so gemma keeps it (min_residency) while its stream runs, then the door switches. The
    smol request's header and page line say both reasons, in order."""
    body = {"model": "gemma", "messages": CHAT, "max_tokens": 48, "ignore_eos": True, "stream": True}
    first = threading.Event()
    out: dict = {}

    def stream_gemma() -> None:
        with httpx.Client(base_url=door.url, timeout=180) as c, \
                c.stream("POST", "/v1/chat/completions", json=body) as r:
            data = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data.append(line[6:])
                    first.set()
            out.update(status=r.status_code, data=data)

    t = threading.Thread(target=stream_gemma)
    t.start()
    try:
        assert first.wait(60), "gemma's stream did not start"
        r = chat(door, "smol")
    finally:
        t.join(120)
    assert out["status"] == 200 and out["data"][-1] == "[DONE]"  # served whole before the switch
    assert r.status_code == 200, r.text
    waited = r.headers["x-servedeck-waited"]
    print(f"smol behind gemma's stream: x-servedeck-waited: {waited}")
    assert re.fullmatch(rf"({PART}), ({PART})", waited), waited
    assert [p.split(" ", 1)[1] for p in waited.split(", ")] == ["min-residency", "switch"]
    assert recent(door, "smollm2")["waited"] == waited


def streams_cut_by(door, model: str, kill, n: int = 3) -> list[dict]:
    """Start `n` streams of 200 tokens for `model`, call `kill(live record)` once each has data, and
    read every stream to its end with httpx (which raises on a chunked body that does not end)."""
    body = {"model": model, "messages": CHAT, "max_tokens": 200, "ignore_eos": True, "stream": True}
    started = [threading.Event() for _ in range(n)]
    got: list[dict] = [{} for _ in range(n)]

    def one(i: int) -> None:
        try:
            with httpx.Client(base_url=door.url, timeout=180) as c, \
                    c.stream("POST", "/v1/chat/completions", json=body) as r:
                got[i]["status"] = r.status_code
                got[i]["chunked"] = r.headers.get("transfer-encoding") == "chunked"
                data = got[i]["data"] = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        data.append(line[6:])
                        if len(data) >= 3:
                            started[i].set()
        except Exception as e:  # noqa: BLE001 - what the client saw is the result
            got[i]["raised"] = f"{type(e).__name__}: {e}"
        finally:
            started[i].set()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    try:
        for e in started:
            assert e.wait(120), "a stream did not start"
        kill(json.loads((door.home / "live" / f"{model}.json").read_text()))
    finally:
        for t in threads:
            t.join(60)
    return got


def wait_stopped(door, model: str, timeout_s: float = 30) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        ms = door.client.get("/v1/models").json()["data"]
        if next(m for m in ms if m["id"] == model)["servedeck"]["state"] == "stopped":
            return
        time.sleep(0.2)
    raise AssertionError(f"{model} not stopped after {timeout_s} s")


def mid_stream_failures(door, model: str) -> float:
    """servedeck_door_upstream_failures_total{model, when="mid-stream"}; 0 while the door has counted none."""
    fams = {f.name: f for f in text_string_to_metric_families(door.client.get("/metrics").text)}
    fam = fams.get("servedeck_door_upstream_failures")
    return sum(s.value for s in (fam.samples if fam else ())
               if s.name.endswith("_total") and s.labels == {"model": model, "when": "mid-stream"})


def test_streams_whose_engine_is_killed_end_with_an_error_event_naming_its_crash(door):
    """The OOM killer's usual pick: the engine itself, SIGKILLed while 3 streams run. Its shim records
    the signal; each stream ends with an error event naming the exit and its classified cause, then
    [DONE], then the chunked body's end; /metrics counts 3 upstream failures mid-stream."""
    before = mid_stream_failures(door, "smollm2")
    got = streams_cut_by(door, "smollm2", lambda rec: os.kill(rec["engine_pid"], signal.SIGKILL))
    print("engine SIGKILLed:", [len(g.get("data", ())) for g in got], "events;", got[0].get("data", ["?"])[-2:])
    for g in got:
        assert "raised" not in g, g.get("raised")
        assert g["status"] == 200 and g["chunked"]
        assert g["data"][-1] == "[DONE]"
        assert len(g["data"]) < 200  # cut short: fewer events than the 200 tokens asked for
        err = json.loads(g["data"][-2])["error"]
        assert err["message"].startswith("smollm2's engine exited mid-stream: killed by SIGKILL; classified cause:")
        assert err["cause"]["id"] == "killed-sigkill"
    assert mid_stream_failures(door, "smollm2") - before == 3


def test_streams_whose_engine_and_shim_are_killed_end_with_an_error_event(door):
    """The issue's own case: the engine's whole process group SIGKILLed (no exit record is written).
    The request starts smollm2 again on demand (relaunch_tries = 0: the watch loop leaves it)."""
    wait_stopped(door, "smollm2")  # until the door has seen the last test's crash (its sync: every second)
    before = mid_stream_failures(door, "smollm2")
    got = streams_cut_by(door, "smollm2", lambda rec: os.killpg(rec["pgid"], signal.SIGKILL))
    print("group SIGKILLed:", [len(g.get("data", ())) for g in got], "events;", got[0].get("data", ["?"])[-2:])
    for g in got:
        assert "raised" not in g, g.get("raised")
        assert g["data"][-1] == "[DONE]"
        err = json.loads(g["data"][-2])["error"]
        assert err["message"].startswith("smollm2's engine exited mid-stream"), err
        assert "no exit record was written" in err["message"]
    assert mid_stream_failures(door, "smollm2") - before == 3
