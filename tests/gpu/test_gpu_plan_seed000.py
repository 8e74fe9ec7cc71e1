"""Seed 000's plans (issue 31, item 8): the MTP variant's draft head, and YaRN to 1M set by --hf-overrides.

The model entries are the seed's (tp 4, FP8 KV; `speculative-config` MTP drafting 3 tokens; the 1M run's
`--hf-overrides` JSON exactly as the seed's cmd.sh has it), read through models.toml and `plan_model` as
`servedeck plan` does. The checkpoint is tests/gpu/fixtures/qwen3.8-27b-written.json (written, not the real
file: it says so), with a sparse weight file of the size the seed's boot log gave (27.64 GiB).
Every expected figure is worked out by hand beside it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servedeck.config.load import parse
from servedeck.gpu.modelplan import plan_model

FIX = Path(__file__).parent / "fixtures"
GiB = 1024**3
H200 = 141 * GiB  # --gpu-gib 141
WEIGHTS = int(27.64 * GiB)  # "Model loading took 27.64 GiB" (seed 000, one DP rank)

# seed 000: $ grep -oE -- "--max-model-len [0-9]+|--hf-overrides .*" cmd.sh
YARN_1M = {"text_config": {"rope_parameters": {
    "mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "yarn", "rope_theta": 10000000,
    "partial_rotary_factor": 0.25, "factor": 4.0, "original_max_position_embeddings": 262144}}}


def checkpoint(tmp_path: Path, weights: bool = True) -> Path:
    d = tmp_path / "Qwen__Qwen3.8-27B-FP8"
    d.mkdir()
    shutil.copy(FIX / "qwen3.8-27b-written.json", d / "config.json")
    if weights:
        with open(d / "model.safetensors", "wb") as fh:
            fh.truncate(WEIGHTS)  # sparse: the size is what the planner reads
    return d


def models(src: Path, context: int = 262144, first_port: int = 8000, build: bool = True, **entries: str) -> str:
    """The seed's entry (tp 4, FP8 KV, utilisation 0.9) once per name, each with its own extra args."""
    text = '[builds.stock]\nengine = "vllm"\npython = "/venvs/vllm-031/bin/python"\n' if build else ""
    for i, (name, extra) in enumerate(entries.items()):
        text += (f'\n[models.{name}]\nsource = "{src}"\nbuild = "stock"\nport = {first_port + i}\nslot = "{name}"\n'
                 f'tp = 4\ncontext = {context}\ngpu_memory_utilization = 0.9\n'
                 f'args = {{ kv-cache-dtype = "fp8"{extra} }}\n')
    return text


def plans(tmp_path: Path, weights: bool = True, **entries):
    src = checkpoint(tmp_path, weights)
    cfg = parse(models(src, **entries), tmp_path / "models.toml")
    return {n: plan_model(cfg, n, gpu_total_bytes=H200)[0] for n in entries}


MTP = ', speculative-config = { method = "mtp", num_speculative_tokens = 3 }'


def test_the_mtp_variant_plans_its_draft_heads_kv(tmp_path):
    p = plans(tmp_path, tp4="", mtp=MTP)
    plain, mtp = p["tp4"], p["mtp"]
    # 64 layers, one in 4 full attention: 16 layers x max(1, 4 kv heads // tp 4) x 256 x (1 + 1 byte, fp8 K and V)
    assert plain.kv_bytes_per_token_per_gpu == 16 * 1 * 256 * 2 == 8192
    # the MTP head is one more full-attention layer with its own KV in the same pool: + 1 x 256 x 2
    assert mtp.kv_bytes_per_token_per_gpu == 8192 + 512
    assert mtp.draft_kv_bytes_per_token_per_gpu == 512
    assert mtp.draft.startswith("MTP head (1 layer, 3 tokens a step)")
    assert mtp.request_bytes_per_gpu - plain.request_bytes_per_gpu == 262144 * 512  # 128 MiB more per request
    assert mtp.kv_pool_tokens < plain.kv_pool_tokens
    # from the files, the weights already hold the head (vLLM loads it only for MTP): not counted twice
    assert mtp.weights_bytes == plain.weights_bytes == WEIGHTS and mtp.draft_weights_bytes == 0
    assert "already in the files" in mtp.draft_basis


def test_without_weight_files_the_mtp_heads_weights_are_estimated(tmp_path):
    p = plans(tmp_path, weights=False, tp4="", mtp=MTP)
    # one decoder layer: attention 5120 x (24 x 256 x 2, gated) + 2 x 5120 x 4 x 256 + 24 x 256 x 5120
    #   = 62,914,560 + 10,485,760 + 31,457,280 = 104,857,600; MLP 3 x 5120 x 17408 = 267,386,880;
    # the embedding-to-hidden projection 2 x 5120 x 5120 = 52,428,800 and its norms 2 x 5120 = 10,240:
    # 424,683,520 parameters at FP8 (8 bits) = 424,683,520 bytes
    assert p["mtp"].weights_bytes - p["tp4"].weights_bytes == 424_683_520
    assert p["mtp"].draft_weights_bytes == 424_683_520
    assert p["mtp"].weights_per_gpu - p["tp4"].weights_per_gpu == 424_683_520 // 4


def test_a_draft_model_adds_its_own_weights_and_kv(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    shutil.copy(FIX / "smollm2-135m-hf.json", draft / "config.json")
    with open(draft / "model.safetensors", "wb") as fh:
        fh.truncate(538_090_408)
    conf = json.dumps({"model": str(draft), "num_speculative_tokens": 4}).replace('"', '\\"')
    p = plans(tmp_path, tp4="", draft=f', speculative-config = "{conf}"')
    # SmolLM2-135M: 30 layers x 3 kv heads (tp 4: max(1, 3 // 4) = 1 per GPU) x 64 x (1 + 1 byte, the pool's fp8)
    assert p["draft"].kv_bytes_per_token_per_gpu == 8192 + 30 * 1 * 64 * 2 == 8192 + 3840
    assert p["draft"].draft_kv_bytes_per_token_per_gpu == 3840
    assert p["draft"].weights_bytes == WEIGHTS + 538_090_408
    assert p["draft"].draft.startswith(f"draft model {draft}")


def test_a_draft_model_that_is_not_here_is_said_not_planned(tmp_path):
    conf = json.dumps({"model": "/nowhere/eagle3-head", "method": "eagle3", "num_speculative_tokens": 3}).replace('"', '\\"')
    p = plans(tmp_path, tp4="", eagle=f', speculative-config = "{conf}"')["eagle"]
    assert p.kv_bytes_per_token_per_gpu == 8192 and p.draft_kv_bytes_per_token_per_gpu == 0
    assert any("draft model /nowhere/eagle3-head" in n and "not in this plan" in n for n in p.notes), p.notes


def test_yarn_set_by_hf_overrides_lifts_the_context_warning(tmp_path):
    """The seed's 1M run: context 1,048,576 with the rope scaling its --hf-overrides sets is within YaRN x4
    of 262,144 trained positions; before, the plan said it was above max_position_embeddings."""
    src = checkpoint(tmp_path)
    seed = json.dumps(YARN_1M)  # the seed's JSON, as a string in models.toml (a TOML table renders the same)
    toml = (models(src, 1048576, yarn1m=f", hf-overrides = '{seed}'", native1m="")
            + models(src, 2097152, 8100, False, yarn2m=f", hf-overrides = '{seed}'"))
    cfg = parse(toml, tmp_path / "models.toml")
    yarn, native, beyond = (plan_model(cfg, n, gpu_total_bytes=H200)[0] for n in ("yarn1m", "native1m", "yarn2m"))
    assert not [n for n in yarn.notes if "above the model's max_position_embeddings" in n], yarn.notes
    assert any("past the 262,144 positions the model was trained on" in n and "yarn ×4 of 262,144" in n
               and "up to 1,048,576" in n for n in yarn.notes), yarn.notes
    assert any("above the model's max_position_embeddings 262,144" in n for n in native.notes), native.notes
    assert any("above the model's max_position_embeddings 1,048,576 even with its rope scaling" in n
               for n in beyond.notes), beyond.notes
    assert yarn.kv_bytes_per_token_per_gpu == 8192 and yarn.context == 1048576  # the rest of the shape unchanged


def test_overrides_update_nested_configs_and_replace_other_values():
    """As vLLM 0.32's _apply_dict_overrides: text_config is updated key by key, rope_parameters replaced whole."""
    from servedeck.gpu.arch import with_overrides

    raw = json.loads((FIX / "qwen3.8-27b-written.json").read_text())
    out = with_overrides(raw, YARN_1M)
    assert out["text_config"]["rope_parameters"] == YARN_1M["text_config"]["rope_parameters"]
    assert out["text_config"]["hidden_size"] == 5120  # the rest of text_config is kept
    assert raw["text_config"]["rope_parameters"]["rope_type"] == "default"  # the file's dict is not changed


def test_an_override_that_is_not_json_is_named(tmp_path):
    from servedeck.errors import UsageError

    src = checkpoint(tmp_path)
    text = models(src, bad=", hf-overrides = \"{not json\"")
    cfg = parse(text, tmp_path / "models.toml")
    with pytest.raises(UsageError) as e:
        plan_model(cfg, "bad", gpu_total_bytes=H200)
    assert "args.hf-overrides: not JSON" in e.value.message
