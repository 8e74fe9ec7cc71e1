"""Issue 36 item 10: a number out of the range an engine (or Python's own waits) can take is refused when
models.toml is loaded, naming its key and the range; it never reaches the engine. A context of 10^12 made
llama-server fail with "stoi" and the hint pointed at `args`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.errors import ConfigError
from servedeck.modelsfile import parse

BASE = """
[builds.l]
engine = "llamacpp"
binary = "/bin/llama-server"
[builds.v]
engine = "vllm"
python = "/usr/bin/python3"
[models.m]
source = "/m.gguf"
build = "{build}"
port = 8000
{line}
"""


def load_with(line: str, build: str = "l", host: str = ""):
    return parse(host + BASE.format(line=line, build=build), Path("/x/models.toml"))


@pytest.mark.parametrize("line, key, expect", [
    ("context = 1000000000000", "models.m.context", "1 to 2147483647"),
    ("context = 0", "models.m.context", "1 to 2147483647"),
    ("max_output_tokens = 1000000000000", "models.m.max_output_tokens", "1 to 2147483647"),
    ("port = 70000", "models.m.port", "1-65535"),
    ("tp = 100000", "models.m.tp", "1 to 1024"),
    ("dp = 0", "models.m.dp", "1 to 1024"),
    ("pp = 5000", "models.m.pp", "1 to 1024"),
    ("replicas = 100000", "models.m.replicas", "1 to 1024"),
    ("gpu_memory_utilization = 1.5", "models.m.gpu_memory_utilization", "(0, 1]"),
    ("stop_timeout_s = 1e12", "models.m.stop_timeout_s", "at most 2592000"),
    ("ready_timeout_s = 1e12", "models.m.ready_timeout_s", "at most 2592000"),
    ("ttl = 1e12", "models.m.ttl", "at most 2592000"),
    ("ttl = \"100000h\"", "models.m.ttl", "at most 2592000"),
])
def test_a_model_key_out_of_range_is_refused_by_name(line, key, expect):
    # tp/dp/pp and gpu_memory_utilization are vLLM's (llama.cpp refuses them outright); port replaces the base's
    build = "v" if line.startswith(("tp", "dp", "pp", "gpu_")) else "l"
    text = BASE.format(line="" if line.startswith("port") else line, build=build)
    if line.startswith("port"):
        text = text.replace("port = 8000", line)
    with pytest.raises(ConfigError) as e:
        parse(text, Path("/x/models.toml"))
    msg = e.value.message
    assert f"/x/models.toml: {key}" in msg, msg
    assert expect in msg, msg


@pytest.mark.parametrize("key", ["relaunch_spacing_s", "liveness_interval_s", "stall_after_s", "drain_timeout_s",
                                 "min_residency_s", "request_wait_s"])
def test_a_host_duration_past_thirty_days_is_refused_by_name(key):
    with pytest.raises(ConfigError) as e:
        load_with("", host=f"[host]\n{key} = 1e12\n")
    assert f"host.{key}" in e.value.message and "at most 2592000" in e.value.message, e.value.message


def test_llamacpp_context_times_slots_must_fit_its_ctx_size_flag():
    """-c is context x parallel: each alone in range, the product past what llama-server parses."""
    with pytest.raises(ConfigError) as e:
        load_with("context = 1000000000\nargs = { parallel = 4 }")
    msg = e.value.message
    assert "models.m.context" in msg and "args.parallel" in msg and "2147483647" in msg, msg


def test_in_range_values_still_load():
    cfg = load_with("context = 1048576\nargs = { parallel = 4 }\nstop_timeout_s = 120\nttl = \"2h\"")
    assert cfg.models["m"].context == 1048576


def test_cli_start_refuses_before_anything_runs(tmp_path, engines_ready):
    """The issue's case through the real CLI: exit 2, the key named, no launch folder made."""
    from ports import starter_toml

    path = tmp_path / "models.toml"
    path.write_text(starter_toml().replace("context = 8192\nargs = { parallel = 4 }",
                                           "context = 1000000000000\nargs = { parallel = 4 }", 1))
    r = subprocess.run([str(Path(sys.executable).with_name("servedeck")), "--config", str(path), "start", "smollm2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "models.smollm2.context" in r.stderr and "2147483647" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "home" / "launches").exists()
