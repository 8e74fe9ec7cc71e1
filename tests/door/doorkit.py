"""Helpers shared by the door tests: the door in a thread, its models.toml, and cleanup."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from servedeck.door.serve import ServeOptions, serve

from ports import free_port, free_port_pair, starter_toml

TEST_MARK = "SERVEDECK_TEST_RUN"  # as tests/conftest.py: the session guard finds what this session started
SESSION = str(os.getpid())


def stop_everything(home: Path) -> None:
    """Stop, by process group, every engine still recorded live under `home` (as tests/conftest.py)."""
    from servedeck.supervisor.process import group_members, stop_group

    for f in (home / "live").glob("*.json"):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if group_members(rec["pgid"]):  # by the shim's start time too: the number may be another's by now
            stop_group(rec["pgid"], 10, leader_create_time=rec.get("create_time"))


HOST_KEYS = """
[host]
relaunch_tries = 0
relaunch_spacing_s = 60
liveness_interval_s = 3600
min_residency_s = 2
drain_timeout_s = 120
queue_max = 8
"""


def door_config(tmp: Path, engines: dict[str, str], **host: object) -> Path:
    """The starter models.toml on free ports, plus side models for ttl, fit, embeddings and boot-failure tests.
    `host` overrides keys of HOST_KEYS (`min_residency_s=30`)."""
    text = starter_toml()
    keys = HOST_KEYS
    for k, v in host.items():
        keys, n = re.subn(rf"^{k} = .*$", f"{k} = {v}", keys, flags=re.M)
        assert n == 1, f"{k} is not a key of HOST_KEYS"
    text = text.replace("[host]\n", keys, 1)
    broken = tmp / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)  # a header and nothing else: llama-server refuses to load it
    text += f"""
[models.smol-side]
source = "{engines['smollm2_gguf']}"
build = "llamacpp"
port = {free_port()}
slot = "side"
context = 1024
ttl = "3s"

[models.gemma-side]
source = "{engines['gemma_gguf']}"
build = "llamacpp"
port = {free_port()}
slot = "side2"
context = 1024

[models.smol-pair]
source = "{engines['smollm2_gguf']}"
build = "llamacpp"
port = {free_port_pair()}
slot = "pair"
context = 1024
replicas = 2
cpus = [[0], [1]]
aliases = ["pair"]
ttl = "4s"

[models.smol-embed]
source = "{engines['smollm2_gguf']}"
build = "llamacpp"
port = {free_port()}
slot = "embed-llama"
context = 512
embeddings = true
args = {{ pooling = "mean" }}

[models.broken]
source = "{broken}"
build = "llamacpp"
port = {free_port()}
slot = "side3"
context = 1024
"""
    # the door's vLLM tests are sized for 4,096 tokens (tests/shared_servers.py says why), half the starter's
    vllm = re.search(r"\[models\.smollm2-vllm\]\n(.*?)\n\n", text, re.S)
    assert vllm
    text = text.replace(vllm.group(0), re.sub(r"^context = \d+.*$", "context = 4096", vllm.group(0), count=1,
                                              flags=re.M))
    path = tmp / "models.toml"
    path.write_text(text)
    return path


class DoorThread:
    """`serve()` (door + watch loop) in a thread of this process, so a test can patch what the
    deck reads (the NVML inventory) the way tests/gpu does."""

    def __init__(self, cfg, opts: ServeOptions):
        self.stop = threading.Event()
        self.port: int | None = None
        self.started = threading.Event()
        self.error: BaseException | None = None

        def ready(port: int) -> None:
            self.port = port
            self.started.set()

        def run() -> None:
            try:
                serve(cfg, opts, on_ready=ready, stop=self.stop)
            except BaseException as e:
                self.error = e
                self.started.set()

        self.thread = threading.Thread(target=run, name="door", daemon=True)
        self.thread.start()
        assert self.started.wait(60), "door did not start"
        if self.error:
            raise self.error
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "door thread did not end"


def engine_metrics(port: int) -> dict[str, float]:
    """An engine's own /metrics, through prometheus-client's parser: sample name → value."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def disconnect_mid_stream(door_url: str, model: str, after_chunks: int = 5) -> None:
    """Ask for 1,500 tokens through the door and drop the connection after a few chunks."""
    import httpx

    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 1500, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with httpx.Client(base_url=door_url, timeout=120) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            got = 0
            for chunk in r.iter_raw():
                got += chunk.count(b"data: ")
                if got >= after_chunks:
                    break  # leaving the block closes the connection mid-stream


def generated_after_disconnect(port: int, running: str, generated: str, before: dict[str, float]) -> float:
    """Wait until the engine says nothing runs and its token counter has settled (two reads 1 s apart
    agree), return how many tokens it generated since `before`. A request the disconnect did not cancel
    keeps running (it asked for 1,500 tokens), so it fails the wait here or the
    caller's bound on the count. CI once saw vLLM's token counter move after its running gauge read 0
    (gauge and counter are recorded from engine outputs as they arrive; the exact cause was not pinned
    down), so one reading of the gauge is not taken as the end."""
    import time

    deadline = time.monotonic() + 20
    seen: list[tuple[float, float]] = []
    while time.monotonic() < deadline:
        m = engine_metrics(port)
        seen.append((m.get(running, -1), m.get(generated, -1)))
        if len(seen) >= 2 and seen[-1][0] == 0 and seen[-2][0] == 0 and seen[-1][1] == seen[-2][1]:
            return m[generated] - before[generated]
        time.sleep(1.0)
    raise AssertionError(f"the engine kept generating after the disconnect: (running, generated) each second: {seen}")


# A function for the openai SDK's tool-call tests (llama.cpp and vLLM). strict: vLLM 0.32 holds a forced
# call's arguments to their schema only then (its --tool-strict-level auto); without it SmolLM2 wrote the
# schema itself as the arguments: {"city": {"type": "string", ...}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def sdk(door_url: str, timeout_s: float = 600):
    """The openai SDK pointed at the door, as a user's code would be (no retries: a test sees every answer)."""
    import openai

    return openai.OpenAI(base_url=door_url + "/v1", api_key="unused", max_retries=0, timeout=timeout_s)


class ServeProcess:
    """`servedeck serve` as a user runs it: a process (and session) of its own, on a free port."""

    def __init__(self, home: Path, config: Path, *args: str, env: dict | None = None):
        self.port = free_port()
        e = {k: v for k, v in os.environ.items() if k != "SERVEDECK_API_KEY"}
        e.update(SERVEDECK_HOME=str(home), SERVEDECK_CONFIG=str(config), **(env or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "servedeck", "serve", "--port", str(self.port), *args],
                                     env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)

    def wait_up(self, host: str = "127.0.0.1") -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                httpx.get(f"http://{host}:{self.port}/v1/models", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError("serve did not start listening")

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode, self.proc.stderr.read()
