"""Golden render tests: the exact argv and env each engine gets from models.toml."""

from __future__ import annotations

import re
from pathlib import Path

from servedeck.modelsfile import parse
from servedeck.deck import Deck
from servedeck.deck.launch import cmd_sh
from servedeck.engines.base import container_name

CONFIG = """
[builds.llama]
engine = "llamacpp"
binary = "/opt/llama/bin/llama-server"

[builds.stock]
engine = "vllm"
python = "/venvs/vllm-029/bin/python"
env = { VLLM_USE_DEEP_GEMM = "0" }

[builds.vllm-image]
engine = "vllm"
image = "vllm/vllm-openai:v0.31.0"
shm_size = "64g"

[builds.sgl]
engine = "sglang"
python = "/venvs/sglang/bin/python"

[models.smollm2]
source = "/models/smollm2.gguf"
build = "llama"
port = 8081
context = 4096
args = { parallel = 4, flash-attn = "on", -ngl = 99 }
gpus = [1]

[models.qwen27b]
source = "RadixArk/Qwen3.8-27B-NVFP4"
build = "stock"
port = 8004
context = 262144
gpus = [0, 1, 2, 3]
dp = 4
gpu_memory_utilization = 0.95
args = { enable-prefix-caching = true, enforce-eager = false, max-num-seqs = 16, speculative-config = { method = "mtp", num_speculative_tokens = 4 }, hf-overrides = { text_config = { rope_parameters = { rope_type = "yarn", factor = 4.0 } } } }
env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True", HF_TOKEN = "hf_secret_value" }

[models.qwen38]
source = "/mnt/data/models/Qwen__Qwen3.8-27B-FP8"
build = "vllm-image"
served_name = "qwen38_27b"
port = 8000
context = 262144
gpus = [0, 1, 2, 3]
dp = 4
gpu_memory_utilization = 0.9
args = { kv-cache-dtype = "fp8", enable-prefix-caching = true, reasoning-parser = "qwen3" }
env = { HF_TOKEN = "hf_secret_value" }

[models.glm]
source = "zai-org/GLM-4.6-FP8"
build = "sgl"
port = 30000
context = 131072
tp = 2
gpus = [2, 3]
gpu_memory_utilization = 0.85
"""


def cfg():
    return parse(CONFIG, Path("/home/u/models.toml"))


def test_llamacpp_argv():
    spec = Deck(cfg()).render("smollm2")
    assert spec.argv == [
        "/opt/llama/bin/llama-server", "-m", "/models/smollm2.gguf", "--host", "127.0.0.1", "--port", "8081",
        "--alias", "smollm2", "-c", "16384", "--metrics", "--log-verbosity", "4",
        "--parallel", "4", "--flash-attn", "on", "-ngl", "99",
    ]
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "1"}


def test_vllm_dp_json_flags_and_env():
    spec = Deck(cfg()).render("qwen27b")
    assert spec.argv == [
        "/venvs/vllm-029/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "RadixArk/Qwen3.8-27B-NVFP4", "--served-model-name", "qwen27b",
        "--host", "127.0.0.1", "--port", "8004", "--max-model-len", "262144",
        "--gpu-memory-utilization", "0.95", "--data-parallel-size", "4",
        "--enable-prefix-caching", "--max-num-seqs", "16",
        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 4}',
        "--hf-overrides", '{"text_config": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}}',
        "--enable-prompt-tokens-details",
    ]
    assert spec.env == {
        "VLLM_USE_DEEP_GEMM": "0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "HF_TOKEN": "hf_secret_value", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    # the secret is in the real env, never in what is shown or written
    assert spec.to_json()["env"]["HF_TOKEN"] == "<redacted>"
    script = cmd_sh(spec, "stock", "/home/u/models.toml")
    assert "hf_secret_value" not in script
    assert ': "${HF_TOKEN:?set HF_TOKEN first}"' in script
    assert "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 4}'" in script


def test_vllm_docker_image_like_the_seed():
    spec = Deck(cfg()).render("qwen38")
    assert spec.argv == [
        "docker", "run", "--rm", "--name", container_name("qwen38"), "--gpus", '"device=0,1,2,3"',
        "--ipc=host", "--network=host", "--shm-size=64g", "-e", "HF_TOKEN",
        "-v", spec.argv[13], "-v", "/mnt/data/models/Qwen__Qwen3.8-27B-FP8:/mnt/data/models/Qwen__Qwen3.8-27B-FP8:ro",
        "vllm/vllm-openai:v0.31.0", "serve", "/mnt/data/models/Qwen__Qwen3.8-27B-FP8",
        "--served-model-name", "qwen38_27b", "--host", "127.0.0.1", "--port", "8000",
        "--max-model-len", "262144", "--gpu-memory-utilization", "0.9", "--data-parallel-size", "4",
        "--kv-cache-dtype", "fp8", "--enable-prefix-caching", "--reasoning-parser", "qwen3",
        "--enable-prompt-tokens-details",
    ]
    assert spec.argv[13].endswith(":/root/.cache/huggingface")
    assert re.fullmatch(r"servedeck-qwen38-[0-9a-f]{8}", spec.argv[4])
    assert "hf_secret_value" not in " ".join(spec.argv)  # the value travels by name, not in argv
    assert "CUDA_VISIBLE_DEVICES" not in spec.env  # docker gets --gpus instead


def test_vllm_reports_cached_tokens_per_request_unless_args_say_otherwise():
    """vLLM's usage carries prompt_tokens_details (each request's cached tokens) only with this flag:
    without it every point warned "the server did not report cached tokens" (the H200 trial)."""
    base = CONFIG + """
[models.plain]
source = "/models/m"
build = "stock"
port = 8100
"""
    assert Deck(parse(base, Path("/m.toml"))).render("plain").argv[-1] == "--enable-prompt-tokens-details"
    for value in ("false", "true"):
        off = parse(base + f"args = {{ enable-prompt-tokens-details = {value} }}\n", Path("/m.toml"))
        argv = Deck(off).render("plain").argv
        assert argv.count("--enable-prompt-tokens-details") == (value == "true"), argv


def test_sglang_argv():
    """SGLang cannot run on servedeck's CI machines: this is argv rendering only."""
    spec = Deck(cfg()).render("glm")
    assert spec.argv == [
        "/venvs/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "zai-org/GLM-4.6-FP8",
        "--served-model-name", "glm", "--host", "127.0.0.1", "--port", "30000", "--context-length", "131072",
        "--mem-fraction-static", "0.85", "--tp-size", "2",
    ]
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "2,3"}


def test_secret_flags_redacted():
    from servedeck.engines.base import LaunchSpec

    spec = LaunchSpec(model="m", engine="vllm", argv=["x", "--api-key", "sk-123", "--hf-token=abc"], env={},
                      host="127.0.0.1", port=1, served_name="m", health_path="/health", slot="main",
                      stop_timeout_s=1, ready_timeout_s=1)
    assert spec.redacted_argv() == ["x", "--api-key", "<redacted>", "--hf-token=<redacted>"]


LLAMA_ONLY = """
[builds.llama]
engine = "llamacpp"
binary = "/opt/llama/bin/llama-server"

[models.m]
source = "/models/m.gguf"
build = "llama"
port = 8081
context = 1024
"""


def _argv(args: str) -> list[str]:
    cfg = parse(LLAMA_ONLY + f"args = {{ {args} }}\n", Path("/etc/models.toml"))
    return Deck(cfg).render("m").argv


def test_a_flag_in_any_spelling_is_rendered_once():
    """Defect: `args = { "--parallel" = 4 }` rendered `--parallel 1 --parallel 4` (and -c for one slot)."""
    for spelling in ('"--parallel" = 4', "parallel = 4", '"-np" = 4'):
        argv = _argv(spelling)
        slots = [a for a in argv if a in ("--parallel", "-np")]
        assert len(slots) == 1, (spelling, argv)
        assert argv[argv.index("-c") + 1] == "4096", (spelling, argv)  # 4 slots × 1024
    assert _argv('"--metrics" = true').count("--metrics") == 1


def test_llamacpp_log_verbosity_is_raised_unless_the_user_set_one():
    """Placement (devices, offloaded layers, buffers per device) is logged only at --log-verbosity 4."""
    assert _argv("")[-2:] == ["--log-verbosity", "4"]
    for spelling in ('"-lv" = 2', "log-verbosity = 3", "verbose = true", "verbosity = 3"):
        argv = _argv(spelling)
        said = [a for a in argv if a in ("-lv", "--log-verbosity", "--verbosity", "--verbose")]
        assert len(said) == 1, (spelling, argv)  # the user's own, and none added
    env = parse(LLAMA_ONLY + 'env = { LLAMA_ARG_LOG_VERBOSITY = "3" }\n', Path("/etc/models.toml"))
    assert "--log-verbosity" not in Deck(env).render("m").argv


def test_two_spellings_of_one_flag_are_refused():
    import pytest

    from servedeck.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        parse(LLAMA_ONLY + 'args = { "-np" = 2, "--parallel" = 4 }\n', Path("/etc/models.toml"))
    assert "models.m.args.--parallel: the same flag as models.m.args.-np (--parallel)" in e.value.message
    with pytest.raises(ConfigError) as e:  # an owned flag in its short spelling
        parse(LLAMA_ONLY + 'args = { "-c" = 2048 }\n', Path("/etc/models.toml"))
    assert "models.m.args.-c: servedeck renders this flag from models.m.context" in e.value.message
