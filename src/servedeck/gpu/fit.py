"""Does a model fit in what is free on its GPUs right now? The deck asks before a start; switch waits on it.

A model's `gpu_memory_utilization` is a requirement, not a wish (the seed's compute_util): vLLM refuses
to start unless total × utilisation is free on each GPU, so that is what it needs. Without one (llama.cpp,
SGLang without mem_fraction_static) the need is the plan's, or the peak measured at the last boot.
A refusal names what is free and who holds the rest; it never suggests lowering the utilisation.

`check_fit` is pure (inventory, holdings and plan in; report out). `fit_now` is the effectful edge the
deck calls before a start (`refuse_unless_fits`); `wait_for_fit` is what a switch waits on after it has
stopped the slot's holder, until the driver has released its memory.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from servedeck.errors import RefusedError
from servedeck.gpu.holders import Holding, describe_gpu_holders, holders
from servedeck.gpu.nvml import Inventory, gib, inventory
from servedeck.engines import MemoryModel, get_engine
from servedeck.gpu.plan import Plan

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
    holder_models: list[str] = field(default_factory=list)  # the servedeck models among them


@dataclass
class FitReport:
    model: str
    status: str  # fits | no-room | unknown (cannot tell here) | running (it already holds its memory)
    reason: str
    need_basis: str = ""
    gpus: list[GpuFit] = field(default_factory=list)
    slot_mates: list[str] = field(default_factory=list)  # models of this one's slot: what `switch` would stop

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
        return f"{self.model} does not fit: " + " | ".join(parts) + f" (needed: {self.need_basis})"

    def holder_models(self) -> list[str]:
        """The servedeck models holding memory on the GPUs where this one does not fit."""
        return sorted({m for g in self.gpus if not g.fits for m in g.holder_models})

    def refusal(self, slot_mates: Iterable[str] | None = None) -> RefusedError:
        """The error a start raises. The hint names a command that would work: `switch` only when every
        model in the way shares this model's slot (switch evicts nothing else), else `--evict` by name."""
        models = self.holder_models()
        foreign = any(len(g.holders) > len(g.holder_models) for g in self.gpus if not g.fits)
        mates = set(self.slot_mates if slot_mates is None else slot_mates)
        if models and not foreign and set(models) <= mates:
            hint = f"`servedeck switch {self.model}` stops {', '.join(models)} (its slot), then starts {self.model}"
        elif models:
            hint = (f"`servedeck start {self.model} --evict {','.join(models)}` stops {', '.join(models)} first; "
                    f"or `servedeck stop {' '.join(models)}`, then start {self.model}")
            if foreign:
                hint += "; the other processes listed are not servedeck's: stop them yourself"
        else:
            hint = "free the GPU memory listed above (the processes are not servedeck's), then retry"
        return RefusedError(f"cannot start {self.model}: {self.message()}", hint=hint)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "message": self.message()}


def need_per_gpu(memory: MemoryModel, utilization: float | None, total: int,
                 plan: Plan | None) -> tuple[int | None, str]:
    """What one GPU must have free for this start, and why."""
    share = memory.required_share(utilization)
    if share is not None:
        dflt = "" if utilization is not None else " (the engine's default; the model sets none)"
        return int(total * share), f"{memory.share_key} {share}{dflt} × {gib(total)}"
    if plan is not None:
        cal = plan.calibrated or {}
        if cal.get("need_bytes_per_gpu"):
            return int(cal["need_bytes_per_gpu"]), "peak measured at this model's last boot"
        if plan.need_bytes_per_gpu:
            return int(plan.need_bytes_per_gpu), plan.need_basis
    return None, ""


def check_fit(
    model: str,
    memory: MemoryModel,
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
        need, basis = need_per_gpu(memory, utilization, g.memory_total, plan)
        if need is None:
            return FitReport(model, UNKNOWN, "not checked: no utilisation set and no plan for this model "
                                              "(see `servedeck plan`)")
        freed = sum(h.used_bytes or 0 for h in holdings if h.gpu == idx and h.model in releasing)
        free = g.memory_free + freed
        names = describe_gpu_holders(holdings, idx, skip=releasing)
        models = sorted({h.model for h in holdings if h.gpu == idx and h.model and h.model not in releasing})
        rows.append(GpuFit(idx, g.name, g.memory_total, free, need, free >= need, names, models))
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


def needs_plan(cfg: "Config", name: str) -> bool:
    """Whether the fit check needs the planner: the engine takes no fixed share of the GPU."""
    model = cfg.models[cfg.resolve(name)]
    memory = get_engine(cfg.deck.builds[model.build].engine).memory
    return memory.required_share(model.gpu_memory_utilization) is None


def fit_of(cfg: "Config", name: str, inv: Inventory, holdings: Iterable[Holding], plan: Plan | None = None,
           releasing: Iterable[str] = ()) -> FitReport:
    """check_fit for a models.toml entry: its engine's memory model, GPUs and utilisation."""
    from servedeck.gpu.modelplan import model_gpus

    mname = cfg.resolve(name)
    model = cfg.models[mname]
    engine = get_engine(cfg.deck.builds[model.build].engine)
    report = check_fit(mname, engine.memory, model_gpus(model, engine, inv), inv, holdings,
                       utilization=model.gpu_memory_utilization, plan=plan, releasing=releasing)
    report.slot_mates = sorted(m for m, other in cfg.models.items() if other.slot == model.slot and m != mname)
    return report


def fit_now(cfg: "Config", name: str, releasing: Iterable[str] = (), inv: Inventory | None = None) -> FitReport:
    """Read NVML and the live records now and check `name`."""
    mname = cfg.resolve(name)
    inv = inv or inventory()
    if not inv.available:
        return FitReport(mname, UNKNOWN, f"not checked: {inv.reason}")
    plan = _plan_or_none(cfg, mname, inv) if needs_plan(cfg, mname) else None
    return fit_of(cfg, mname, inv, holders(inv), plan=plan, releasing=releasing)


def refuse_unless_fits(cfg: "Config", name: str, slot_mates: Iterable[str] | None = None,
                       inv: Inventory | None = None) -> FitReport:
    """The deck's pre-start check: raises RefusedError (naming what is free, who holds the rest, and a
    command that would free it) when the model positively does not fit; returns the report otherwise.
    `slot_mates`: the running models of this model's slot (default: those models.toml puts there)."""
    report = fit_now(cfg, name, inv=inv)
    if not report.ok:
        raise report.refusal(slot_mates)
    return report


def wait_for_fit(cfg: "Config", name: str, timeout_s: float = 120.0, poll_s: float = 0.5,
                 on_wait: Callable[[FitReport, float], None] | None = None,
                 read: Callable[[], FitReport] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[FitReport, float]:
    """Poll until `name` fits (a switch after stopping the old model: the driver frees its memory some
    seconds after the process exits). Returns (the last report, seconds waited); the caller refuses if it
    still does not fit. `on_wait(report, waited_s)` is called on each miss so the deck can say what it
    is waiting for. Blocking, like every deck operation."""
    read = read or (lambda: fit_now(cfg, name))
    start = time.monotonic()
    while True:
        report = read()
        waited = time.monotonic() - start
        if report.status != NO_ROOM or waited >= timeout_s:
            return report, waited
        if on_wait:
            on_wait(report, waited)
        sleep(poll_s)
