"""GPUs: NVML inventory, who holds what, memory planning, measured-vs-predicted, and the fit check.

Public surface (the modules behind it are private to this package):
    inventory() -> Inventory                     NVML now; never raises for "no GPU here"
    holders(inv) -> list[Holding]                GPU pids mapped to servedeck models (process groups/descendants)
    plan_model(cfg, name, inv) -> (Plan, last)   weights, KV per token, pool tokens, full-length requests
    record_measurement(model, build, boot_facts, prediction, gpu_used_bytes=..., launch_dir=...)
    record_boot(name, cfg, boot_facts, launch_dir=...)   the deck's one call after a boot: plans, measures, records
    fit_now(cfg, name, releasing=()) -> FitReport    the deck refuses a start with `raise report.refusal()`
    wait_for_fit(cfg, name, timeout_s)           async: switch waits for the old model's memory to be freed
"""

from servedeck.gpu.fit import FitReport, GpuFit, check_fit, fit_now, wait_for_fit
from servedeck.gpu.holders import Holding, attribute, describe_gpu_holders, holders, live_records, model_gpu_use
from servedeck.gpu.measured import last_measurement, measurements, record_measurement
from servedeck.gpu.modelplan import PlanError, plan_model, record_boot
from servedeck.gpu.nvml import Gpu, GpuProcess, Inventory, inventory
from servedeck.gpu.plan import Plan, PlanInputs, compute

__all__ = [
    "FitReport", "Gpu", "GpuFit", "GpuProcess", "Holding", "Inventory", "Plan", "PlanError", "PlanInputs",
    "attribute", "check_fit", "compute", "describe_gpu_holders", "fit_now", "holders", "inventory",
    "last_measurement", "live_records", "measurements", "model_gpu_use", "plan_model", "record_boot", "record_measurement",
    "wait_for_fit",
]
