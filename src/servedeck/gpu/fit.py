"""Does a model fit in what is free on its GPUs right now? The deck asks before a start; switch waits on it.

A model's `gpu_memory_utilization` is a requirement, not a wish (the seed's compute_util): vLLM refuses
to start unless total × utilisation is free on each GPU, so that is what it needs. Without one (llama.cpp,
SGLang without mem_fraction_static) the need is the plan's, or the peak measured at the last boot.
A refusal names what is free and who holds the rest; it never suggests lowering the utilisation.

`check_fit` is pure (inventory, holdings and plan in; report out). `fit_now` and `wait_for_fit` are the
effectful edges the deck calls.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from servedeck.errors import RefusedError
from servedeck.gpu.holders import Holding, by_holder, holders
from servedeck.gpu.nvml import Inventory, gib, inventory
from servedeck.gpu.plan import VLLM_DEFAULT_UTIL, Plan

if TYPE_CHECKING:
    from servedeck.config import Config

FITS, NO_ROOM, UNKNOWN, RUNNING = "fits", "no-room", "unknown", "running"


@dataclass
class GpuFit:
    gpu: int
    name: str
    total: int
    free: int  # free now, plus what releasing models hold
    need: int
    fits: bool
    holders: list[str] = field(default_factory=list)  # "gemma on GPU 0 holds 93.5 GiB"


@dataclass
class FitReport:
    model: str
    status: str  # fits | no-room | unknown (cannot tell here) | running (it already holds its memory)
    reason: str
    need_basis: str = ""
    gpus: list[GpuFit] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """False only when it positively does not fit: "unknown" must not block a CPU host."""
        return self.status != NO_ROOM

    def message(self) -> str:
        if self.status != NO_ROOM:
            return self.reason
        parts = []
        for g in self.gpus:
            if g.fits:
                continue
            held = "; ".join(g.holders) if g.holders else "no process is listed as holding it"
            parts.append(f"GPU {g.gpu} ({g.name}): needs {gib(g.need)} free, {gib(g.free)} is free "
                         f"of {gib(g.total)}; {held}")
        return f"{self.model} does not fit: " + " | ".join(parts) + f" (need: {self.need_basis})"

    def refusal(self) -> RefusedError:
        others = sorted({h.split(" on GPU ")[0] for g in self.gpus if not g.fits for h in g.holders})
        hint = (f"stop or switch away from what holds the memory ({', '.join(others)}), e.g. "
                f"`servedeck switch {self.model}`" if others else "free the GPU memory listed above, then retry")
        return RefusedError(self.message(), hint=hint)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "message": self.message()}


def need_per_gpu(engine: str, utilization: float | None, total: int, plan: Plan | None) -> tuple[int | None, str]:
    """What one GPU must have free for this start, and why."""
    if engine == "vllm" or (engine == "sglang" and utilization is not None):
        util = utilization if utilization is not None else VLLM_DEFAULT_UTIL
        key = "gpu_memory_utilization" if engine == "vllm" else "mem_fraction_static"
        dflt = "" if utilization is not None else " (vLLM's default; the model sets none)"
        return int(total * util), f"{key} {util}{dflt} × {gib(total)}"
    if plan is not None:
        cal = plan.calibrated or {}
        if cal.get("need_bytes_per_gpu"):
            return int(cal["need_bytes_per_gpu"]), "peak measured at this model's last boot"
        if plan.need_bytes_per_gpu:
            return int(plan.need_bytes_per_gpu), f"planned ({plan.need_basis})"
    return None, ""


def check_fit(
    model: str,
    engine: str,
    gpus: list[int],
    inv: Inventory,
    holdings: Iterable[Holding],
    *,
    utilization: float | None = None,
    plan: Plan | None = None,
    releasing: Iterable[str] = (),
) -> FitReport:
    """Pure. `releasing`: models being stopped for this start (a switch): their memory counts as free."""
    if not inv.available:
        return FitReport(model, UNKNOWN, f"not checked: {inv.reason}")
    holdings = list(holdings)
    if any(h.model == model for h in holdings):
        held = sum(h.used_bytes or 0 for h in holdings if h.model == model)
        return FitReport(model, RUNNING, f"{model} is running and holds {gib(held)}")
    missing = [g for g in gpus if inv.gpu(g) is None]
    if missing:
        have = ", ".join(str(g.index) for g in inv.gpus)
        return FitReport(model, NO_ROOM, f"GPU {missing} does not exist here (GPUs: {have})",
                         gpus=[GpuFit(g, "absent", 0, 0, 0, False) for g in missing])
    releasing = set(releasing)
    rows, basis = [], ""
    for idx in gpus:
        g = inv.gpu(idx)
        assert g is not None
        need, basis = need_per_gpu(engine, utilization, g.memory_total, plan)
        if need is None:
            return FitReport(model, UNKNOWN, "not checked: no utilisation set and no plan for this model "
                                              "(see `servedeck plan`)")
        freed = sum(h.used_bytes or 0 for h in holdings if h.gpu == idx and h.model in releasing)
        free = g.memory_free + freed
        names = [f"{who} on GPU {idx} holds {gib(used)}" for who, used in by_holder(holdings, idx)
                 if who not in releasing]
        rows.append(GpuFit(idx, g.name, g.memory_total, free, need, free >= need, names))
    ok = all(r.fits for r in rows)
    if ok:
        spare = min(r.free - r.need for r in rows)
        reason = f"fits: needs {gib(rows[0].need)} per GPU on GPU {gpus}, {gib(spare)} to spare ({basis})"
    else:
        reason = "does not fit"
    return FitReport(model, FITS if ok else NO_ROOM, reason, basis, rows)


def _plan_or_none(cfg: "Config", name: str, inv: Inventory) -> Plan | None:
    from servedeck.errors import ServedeckError
    from servedeck.gpu.modelplan import plan_model

    try:
        return plan_model(cfg, name, inv)[0]
    except (ServedeckError, ValueError, OSError):
        return None  # no plan: the check says "unknown" unless the utilisation alone decides


def fit_now(cfg: "Config", name: str, releasing: Iterable[str] = (), inv: Inventory | None = None) -> FitReport:
    """Read NVML and the live records now and check `name`. The deck refuses a start with
    `raise report.refusal()` when `not report.ok`."""
    from servedeck.gpu.modelplan import model_gpus

    mname = cfg.resolve(name)
    model = cfg.models[mname]
    engine = cfg.deck.builds[model.build].engine
    inv = inv or inventory()
    if not inv.available:
        return FitReport(mname, UNKNOWN, f"not checked: {inv.reason}")
    needs_plan = not (engine == "vllm" or (engine == "sglang" and model.gpu_memory_utilization is not None))
    plan = _plan_or_none(cfg, mname, inv) if needs_plan else None
    return check_fit(mname, engine, model_gpus(model, engine, inv), inv, holders(inv),
                     utilization=model.gpu_memory_utilization, plan=plan, releasing=releasing)


async def wait_for_fit(cfg: "Config", name: str, timeout_s: float = 120.0, poll_s: float = 1.0,
                       on_wait: Callable[[FitReport, float], None] | None = None,
                       read: Callable[[], FitReport] | None = None) -> FitReport:
    """Poll until `name` fits (a switch after stopping the old model: the driver frees its memory some
    seconds after the process exits). Returns the last report; the caller refuses if it still does not fit.
    `on_wait(report, waited_s)` is called on each miss so the deck can say what it is waiting for."""
    read = read or (lambda: fit_now(cfg, name))
    start = time.monotonic()
    while True:
        report = read()
        waited = time.monotonic() - start
        if report.status != NO_ROOM or waited >= timeout_s:
            return report
        if on_wait:
            on_wait(report, waited)
        await asyncio.sleep(poll_s)
