"""Measured beside predicted: after each boot the deck records what the engine reported next to the plan.

One JSON line per boot in $SERVEDECK_HOME/plans/<model>.jsonl (append-only, so history is kept and a torn
last line from a crash is skipped on read). `plan` shows the last one; the doctor's fit check uses the
floor it implies (weights + activations + graphs as the engine really allocated them).

    record = {
      "schema": 1, "at": ISO time, "model", "build", "engine", "launch_dir",
      "predicted": {kv_pool_tokens, full_length_requests, pool_bytes_per_gpu, kv_bytes_per_token_per_gpu,
                    context, utilization, gpu_total_bytes, budget_bytes_per_gpu},
      "measured":  {kv_tokens, max_concurrency, kv_gib, model_loading_gib, graph_capture_gib, kv_cache_dtype, ...},
      "gpu_used_bytes": {"0": bytes, ...},       # per GPU, from NVML via holders.model_gpu_use
      "floor_bytes_per_gpu": int | None,          # budget − KV memory (vLLM) or the measured peak (llama.cpp)
      "kv_tokens_error_pct": float | None,        # (measured − predicted) / predicted × 100
    }
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from servedeck import paths
from servedeck.fsio import append_jsonl, read_jsonl

SCHEMA = 1
GiB = 1024**3
_PRED_KEYS = ("kv_pool_tokens", "full_length_requests", "pool_bytes_per_gpu", "kv_bytes_per_token_per_gpu",
              "context", "utilization", "gpu_total_bytes", "budget_bytes_per_gpu", "kv_dtype", "engine",
              "need_bytes_per_gpu", "tp", "pp", "dp")
_BOOT_KEYS = ("kv_tokens", "kv_device", "max_concurrency", "max_concurrency_request_tokens", "kv_gib",
              "model_loading_gib", "graph_capture_gib", "kv_cache_dtype", "init_engine_s", "engine_version",
              "ctx_total", "slots", "ctx_per_slot", "weights_gib", "max_total_num_tokens", "context_len")


def plans_dir() -> Path:
    return paths.made(paths.home() / "plans")


def _file(model: str) -> Path:
    return plans_dir() / (re.sub(r"[^\w.-]", "_", model) + ".jsonl")


def _as_dict(prediction: Any) -> dict[str, Any]:
    if prediction is None:
        return {}
    if hasattr(prediction, "to_json"):
        return prediction.to_json()
    return dict(prediction)


def summarise(model: str, build: str, boot_facts: Mapping[str, Any], prediction: Any,
              gpu_used_bytes: Mapping[int, int] | None = None, launch_dir: str | None = None) -> dict[str, Any]:
    """Pure: the record `record_measurement` writes."""
    pred = _as_dict(prediction)
    predicted = {k: pred.get(k) for k in _PRED_KEYS if pred.get(k) is not None}
    measured = {k: boot_facts[k] for k in _BOOT_KEYS if boot_facts.get(k) is not None}
    if "kv_tokens" not in measured and boot_facts.get("max_total_num_tokens"):  # SGLang's name for it
        measured["kv_tokens"] = boot_facts["max_total_num_tokens"]
    floor = None
    budget = pred.get("budget_bytes_per_gpu")
    if budget and measured.get("kv_gib") is not None:  # a share-based pool: floor = budget − KV
        floor = int(budget - float(measured["kv_gib"]) * GiB)
    elif gpu_used_bytes:
        floor = max(int(v) for v in gpu_used_bytes.values())
    err = None
    p, m = predicted.get("kv_pool_tokens"), measured.get("kv_tokens")
    if p and m is not None:
        err = round((float(m) - float(p)) / float(p) * 100, 2)
    return {
        "schema": SCHEMA,
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": model,
        "build": build,
        "engine": pred.get("engine"),
        "launch_dir": str(launch_dir) if launch_dir else None,
        "predicted": predicted,
        "measured": measured,
        "gpu_used_bytes": {str(k): int(v) for k, v in (gpu_used_bytes or {}).items()},
        "floor_bytes_per_gpu": floor,
        "kv_tokens_error_pct": err,
    }


def record_measurement(model: str, build: str, boot_facts: Mapping[str, Any], prediction: Any, *,
                       gpu_used_bytes: Mapping[int, int] | None = None,
                       launch_dir: str | Path | None = None) -> dict[str, Any]:
    """Store what a boot reported (`engine.parse_boot(log)`) beside the plan made for it.

    `prediction` is a `Plan` or its `to_json()` (from `plan_model`); `gpu_used_bytes` what the model's
    processes hold per GPU after boot (`holders.model_gpu_use`). Returns the record written."""
    rec = summarise(model, build, boot_facts, prediction, gpu_used_bytes,
                    str(launch_dir) if launch_dir else None)
    append_jsonl(_file(model), rec)
    return rec


def last_measurement(model: str, build: str | None = None, context: int | None = None) -> dict[str, Any] | None:
    """The newest record for model (and build, and context when given: a floor measured at another
    context or layout says little about this one)."""
    for rec in reversed([r for r in read_jsonl(_file(model)) if r.get("schema") == SCHEMA]):
        if build is not None and rec.get("build") != build:
            continue
        if context is not None and rec.get("predicted", {}).get("context") not in (None, context):
            continue
        return rec
    return None
