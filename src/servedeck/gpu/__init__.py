"""GPUs: NVML inventory, who holds what, memory planning, measured-vs-predicted, and the fit check.

Public surface (the modules behind it are private to this package):
    inventory() -> Inventory                     NVML now; never raises for "no GPU here"
    holders.holders(inv) -> list[Holding]        GPU pids mapped to servedeck models (process groups/descendants);
                                                 not re-exported: it would hide the module holders.py
    plan_model(cfg, name, inv) -> (Plan, last)   weights, KV per token, pool tokens, full-length requests
    record_measurement(model, build, boot_facts, prediction, gpu_used_bytes=..., launch_dir=...)
    record_boot(name, cfg, boot_facts, launch_dir=...)   the deck's one call after a boot: plans, measures, records
    fit_now(cfg, name, releasing=()) -> FitReport    does the model fit in what is free now, and who holds the rest
    refuse_unless_fits(cfg, name, slot_mates)    the deck's pre-start check: raises RefusedError with a working hint
    wait_for_fit(cfg, name, timeout_s)           a switch, after stopping the slot's holder, waits until the
                                                 driver has freed its memory -> (report, waited_s)
"""

from servedeck.gpu.fit import FitReport, GpuFit, check_fit, fit_now, refuse_unless_fits, wait_for_fit
from servedeck.gpu.holders import Holding, attribute, describe_gpu_holders, live_records, model_gpu_use
from servedeck.gpu.measured import last_measurement, record_measurement
from servedeck.gpu.modelplan import PlanError, plan_model, record_boot
from servedeck.gpu.nvml import Gpu, GpuProcess, Inventory, inventory
from servedeck.gpu.plan import Plan, PlanInputs, compute

__all__ = [
    "FitReport", "Gpu", "GpuFit", "GpuProcess", "Holding", "Inventory", "Plan", "PlanError", "PlanInputs",
    "attribute", "check_fit", "compute", "describe_gpu_holders", "fit_now", "refuse_unless_fits", "inventory",
    "last_measurement", "live_records", "model_gpu_use", "plan_model", "record_boot", "record_measurement",
    "wait_for_fit",
]
