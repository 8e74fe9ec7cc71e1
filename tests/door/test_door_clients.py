"""Clients nobody here wrote, pointed at the door on real llama-server engines (issue 31, items 16-19):
the probes that load generators and load balancers send before anything else (guidellm's GET /health,
aiperf's /health, /v1/health and /v1/models, vllm-router's /health), guidellm itself running a
benchmark through the door, the openai SDK's tool calls, embeddings and completion logprobs.
One door for the module (tests/door/conftest.py); llama-server boots in about a second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from servedeck.door import ServeOptions
from servedeck.modelsfile import load

from doorkit import DoorThread, door_config

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

KEY = "health-probe-key"


def test_health_answers_the_probes_clients_send_with_each_models_state(door):
    """guidellm validates its backend with GET {target}/health; aiperf's endpoint check tries /health,
    /v1/health, /v1/models and /; vllm-router probes each worker's /health; llama-server answers both
    /health and /v1/health. The door answers all of them, with its models' states, without starting any."""
    for path in ("/health", "/v1/health"):
        r = door.client.get(path)
        assert r.status_code == 200, (path, r.text)
        body = r.json()
        assert body["status"] == "ok"
        assert body["models"]["smollm2"]["state"] in ("stopped", "ready")
        assert body["models"]["smollm2"]["slot"] == "main"
        assert "smol" in body["models"]["smollm2"]["aliases"]
        assert door.client.head(path).status_code == 200
    # a probe of one model: 200 only while it is ready, 503 with its state otherwise, 404 for no such model
    r = door.client.get("/health", params={"model": "gemma-side"})
    assert r.status_code == 503 and r.json()["models"]["gemma-side"]["state"] == "stopped", r.text
    r = door.client.get("/health", params={"model": "nope"})
    assert r.status_code == 404 and "'nope'" in r.json()["error"]["message"]
    # nothing was started by asking
    assert door.client.get("/health").json()["models"]["gemma-side"]["state"] == "stopped"


def test_health_is_open_with_a_key_but_says_the_states_only_to_a_caller_with_it(tmp_path, engines_ready):
    """Load balancers probe without credentials (vllm-router sends none by default; llama-server and vLLM
    keep /health outside their --api-key): the door answers the probe, and the model list only with the key."""
    cfg = load(door_config(tmp_path, engines_ready))
    d = DoorThread(cfg, ServeOptions(port=0, watch=False, api_keys=[KEY]))
    try:
        r = httpx.get(d.url + "/health", timeout=30)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
        r = httpx.get(d.url + "/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert r.status_code == 200 and r.json()["models"]["smollm2"]["state"] == "stopped", r.text
        assert httpx.get(d.url + "/v1/models", timeout=30).status_code == 401  # the rest stays closed
    finally:
        d.close()


def test_a_ready_model_answers_its_own_health_probe(door):
    r = door.client.post("/v1/chat/completions", json={"model": "smol", "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    r = door.client.get("/health", params={"model": "smol"})  # an alias works as everywhere
    assert r.status_code == 200 and r.json()["models"]["smollm2"]["state"] == "ready", r.text


def guidellm(door, engines_ready, out: Path, *extra: str, model: str = "smollm2") -> subprocess.CompletedProcess:
    """guidellm as a user runs it against the door, offline: the tokenizer it counts tokens with is SmolLM2's
    own, from the HF-layout copy set-up made (the GGUF's tokenizer), so nothing is fetched from a hub."""
    exe = Path(sys.executable).with_name("guidellm")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={door.url},model={model}",
           "--tokenizer", f"kind=huggingface_auto,model={engines_ready['smollm2_hf']}",
           "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=16",
           "--output", f"kind=json,path={out}", "--disable-console-interactive", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=out.parent)


def test_guidellm_runs_a_benchmark_through_the_door_offline(door, engines_ready, tmp_path):
    """guidellm 0.8.1 (the `clients` extra) with its defaults: it validates the backend with GET /health,
    then runs a synchronous profile of 6 requests of 64 prompt / 16 output tokens through the door to
    llama-server. Before the door answered /health, guidellm stopped at its validation."""
    out = tmp_path / "benchmarks.json"
    p = guidellm(door, engines_ready, out, "--profile", "kind=synchronous", "--constraint", "kind=max_requests,count=6")
    assert p.returncode == 0, f"guidellm exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    [bench] = doc["benchmarks"]
    assert bench["scheduler_state"]["successful_requests"] == 6 and bench["scheduler_state"]["errored_requests"] == 0
    done = bench["requests"]["successful"]
    assert len(done) == 6 and not bench["requests"]["errored"]
    for q in done:  # the engine's own answers: 16 tokens each (SmolLM2's tokenizer), streamed, timed
        assert q["output_tokens"] == 16 and q["prompt_tokens"] > 0 and q["time_to_first_token_ms"] > 0, q
        assert q["response_id"].startswith("chatcmpl-") and q["output"]
    assert door.client.get("/health", params={"model": "smollm2"}).status_code == 200
    ttft = bench["metrics"]["time_to_first_token_ms"]["successful"]
    print(f"\nguidellm through the door: 6/6 requests, TTFT median {ttft['median']:.0f} ms, "
          f"{bench['duration']:.1f} s in all")
