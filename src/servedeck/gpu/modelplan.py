"""The planner's edge: a models.toml entry → files → `Arch` → `PlanInputs` → `Plan`.

Everything the engine would be told (args, env, tp/dp/pp, gpu_memory_utilization) is read from the same
model entry the deck launches, so the plan describes the launch servedeck would really make.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servedeck.engines import Engine, get_engine
from servedeck.errors import PlanError, ServedeckError
from servedeck.gpu import measured
from servedeck.gpu.arch import Arch, from_gguf, from_hf_config, with_overrides
from servedeck.gpu.gguf_header import GGUFError, read_header
from servedeck.gpu.nvml import Inventory
from servedeck.gpu.plan import DEFAULT_MAX_BATCHED, DEFAULT_MAX_NUM_SEQS, Plan, PlanInputs, compute
from servedeck.gpu.source import SourceFiles, read_json, resolve, safetensors_total

if TYPE_CHECKING:
    from servedeck.config import Build, Config, Model


def engine_env(model: "Model", build: "Build") -> dict[str, str]:
    return {**build.env, **model.env}


def source_files(cfg: "Config", name: str) -> SourceFiles:
    model = cfg.model(name)
    build = cfg.deck.builds[model.build]
    src = cfg.expand(model.source) if model.source.startswith(("/", "~", ".", "$")) else model.source
    rev = get_engine(build.engine).arg(model, "revision")
    return resolve(src, engine_env(model, build), str(rev) if rev else None, base=cfg.path.parent)


def load_arch(sf: SourceFiles, overrides: dict[str, Any] | None = None) -> Arch:
    """The model's shape from its files; `overrides` (the engine's config overrides, --hf-overrides)
    applied to config.json first, as the engine applies them."""
    if sf.problem:
        raise PlanError(f"cannot plan: {sf.problem}", hint="see `servedeck doctor MODEL`: its weights row says more")
    gguf = next((w for w in sf.weight_files if w.suffix == ".gguf"), None) if sf.config_path is None else None
    if sf.kind == "gguf" or gguf is not None:
        path = sf.path if sf.kind == "gguf" else gguf
        try:
            return from_gguf(read_header(path), str(path))
        except (GGUFError, OSError, ValueError) as e:
            raise PlanError(f"cannot read the GGUF header of {path}: {e}") from None
    raw = read_json(sf.config_path)
    if raw is None:
        raise PlanError(f"cannot plan: {sf.config_path} is missing or not valid JSON")
    if overrides:
        raw = with_overrides(raw, overrides)
    exact = safetensors_total(sf)
    weights = exact if exact is not None else sf.weights_bytes
    extra = read_json(sf.path / "hf_quant_config.json") if sf.path else None
    try:
        return from_hf_config(raw, sf.describe(), weights, extra)
    except (ValueError, KeyError, TypeError) as e:
        raise PlanError(f"cannot plan from {sf.config_path}: {e}") from None


def model_gpus(model: "Model", engine: Engine, inv: Inventory | None) -> list[int]:
    """The GPUs a launch would use: `gpus` when set; else what the engine takes by default."""
    have = [g.index for g in inv.gpus] if inv and inv.available else []
    return engine.default_gpus(model, have)


def draft_of(cfg: "Config", name: str) -> dict[str, Any]:
    """The launch's speculative decoding as its adapter reads the rendered argv, and the draft model's shape
    when it names one (PlanInputs fields: speculation, draft, draft_tp, draft_problem)."""
    model = cfg.models[name]
    build = cfg.deck.builds[model.build]
    engine = get_engine(build.engine)
    spec = engine.speculation(engine.render(name, cfg).argv)
    if not spec:
        return {}
    conf = spec.get("config") if isinstance(spec.get("config"), dict) else {}
    src = spec.get("draft_model") or conf.get("model")
    out: dict[str, Any] = {"speculation": {k: v for k, v in spec.items() if k != "config"} | {"config": conf}}
    if conf.get("draft_tensor_parallel_size"):
        out["draft_tp"] = int(conf["draft_tensor_parallel_size"])
    if src:
        src = str(src)
        local = cfg.expand(src) if src.startswith(("/", "~", ".", "$")) else src
        try:
            out["draft"] = load_arch(resolve(local, engine_env(model, build), None, base=cfg.path.parent))
        except PlanError as e:
            out["draft_problem"] = f"draft model {src}: {e.message}"
    return out


def inputs_for(model: "Model", build: "Build", gpu_total_bytes: int | None,
               measured_floor: int | None = None, draft: dict[str, Any] | None = None) -> PlanInputs:
    engine = get_engine(build.engine)
    arg = engine.arg
    knobs = engine.plan_knobs(model, engine_env(model, build))
    return PlanInputs(
        engine=engine.name,
        memory=engine.memory,
        context=model.context,
        tp=model.tp, dp=model.dp, pp=model.pp,
        dtype=str(arg(model, "dtype") or "auto"),
        gpu_total_bytes=gpu_total_bytes,
        utilization=model.gpu_memory_utilization,
        max_num_seqs=int(arg(model, "max_num_seqs") or DEFAULT_MAX_NUM_SEQS),
        max_num_batched_tokens=int(arg(model, "max_num_batched_tokens") or DEFAULT_MAX_BATCHED),
        block_size=int(arg(model, "block_size")) if arg(model, "block_size") else None,
        enforce_eager=bool(arg(model, "enforce_eager")),
        measured_floor_bytes=measured_floor,
        **knobs,
        **(draft or {}),
    )


def plan_model(cfg: "Config", name: str, inv: Inventory | None = None, gpus: list[int] | None = None,
               gpu_total_bytes: int | None = None) -> tuple[Plan, dict[str, Any] | None]:
    """(plan, last measurement) for a model as models.toml would launch it.

    GPU size: `gpu_total_bytes` when given, else the smallest of the model's GPUs in `inv` (a pool is
    sized by its smallest member)."""
    mname = cfg.resolve(name)
    model = cfg.models[mname]
    build = cfg.deck.builds[model.build]
    arch = load_arch(source_files(cfg, mname), get_engine(build.engine).config_overrides(model))
    if gpu_total_bytes is None and inv is not None and inv.available:
        use = gpus or model_gpus(model, get_engine(build.engine), inv)
        sizes = [g.memory_total for g in inv.gpus if g.index in use]
        gpu_total_bytes = min(sizes) if sizes else None
    last = measured.last_measurement(mname, model.build, model.context)
    floor = last.get("floor_bytes_per_gpu") if last else None
    # a floor is only comparable on the same GPU size and layout
    if last and (last.get("predicted", {}).get("gpu_total_bytes") not in (None, gpu_total_bytes)
                 or last.get("predicted", {}).get("tp", model.tp) != model.tp):
        floor = None
    plan = compute(arch, inputs_for(model, build, gpu_total_bytes, floor, draft_of(cfg, mname)))
    return plan, last


def record_boot(name: str, cfg: "Config", boot_facts: dict[str, Any], launch_dir: str | None = None,
                inv: Inventory | None = None) -> dict[str, Any] | None:
    """What the deck calls after a boot: plan the launch as configured, read what the model's processes
    hold on each GPU, and store both beside the engine's own figures. None when the model cannot be
    planned (no config.json / header to read): nothing to compare against."""
    from servedeck.gpu.holders import holders, model_gpu_use
    from servedeck.gpu.nvml import inventory

    mname = cfg.resolve(name)
    inv = inv if inv is not None else inventory()
    try:
        prediction, _ = plan_model(cfg, mname, inv)
    except (ServedeckError, ValueError, OSError):
        return None
    used = model_gpu_use(mname, holders(inv)) if inv.available else {}
    return measured.record_measurement(mname, cfg.models[mname].build, boot_facts, prediction,
                                       gpu_used_bytes=used, launch_dir=launch_dir)
