"""The memory planner: weights, KV bytes per token, KV pool tokens, full-length requests that fit.

`compute(arch, inputs)` is pure arithmetic on an `Arch` (arch.py) and `PlanInputs`; `plan_model()` is the
edge that reads models.toml, finds the files and the GPU size. Formulas (shared/ENGINES.md):

    per token, one layer   full/sliding: kv_heads_per_gpu × head_dim × (K bytes + V bytes)
                           kv_heads_per_gpu = max(1, kv_heads // tp)   (replicated when kv_heads < tp)
                           mla: (kv_lora_rank + qk_rope_head_dim) × bytes, the same on every TP rank
    per sequence, linear   conv (kernel − 1) × conv_dim / tp  +  SSM value_heads/tp × k_dim × v_dim  (model dtype)
    sliding layers hold    min(context, window − 1 + max_num_batched_tokens) in vLLM, window + ubatch in llama.cpp
    pipeline parallel      each GPU holds 1/pp of the layers (and of the weights)
    vLLM pool per GPU      total × utilisation − weights − activation peak − non-torch − CUDA graphs
    SGLang pool per GPU    total × mem_fraction_static − weights (activations live outside the fraction)
    KV pool tokens         whole blocks: vLLM reports concurrency × context, concurrency = blocks / blocks-per-request

Activation, non-torch and CUDA-graph figures are estimates, labelled as such; after a boot the engine's own
figures are recorded (measured.py) and `calibrated` re-derives the pool from the measured floor.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from servedeck.engines.base import MemoryModel
from servedeck.gpu.arch import Arch, dtype_bytes

GiB = 1024**3

# Defaults of a pool engine when the model's args do not set them (vLLM's V1 engine, OpenAI server)
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_BATCHED = 8192
UBATCH = 512  # an allocating engine's micro-batch (llama.cpp -ub)
POOL_DEFAULT_SHARE = 0.9  # a pool engine whose adapter names no default share
NON_TORCH_BYTES = int(0.5 * GiB)  # CUDA context, cuBLAS workspaces: seen 0.4-0.7 GiB per GPU
NCCL_BYTES = int(0.5 * GiB)  # NCCL buffers when tp/pp > 1
CUDA_GRAPH_BYTES = int(1.0 * GiB)  # ENGINES.md: "Graph capturing finished … took 1.22 GiB"


POOL = MemoryModel()  # the planner's default engine: a vLLM-like pool (ENGINES.md's formulas)


@dataclass(frozen=True)
class PlanInputs:
    engine: str = ""  # a label for the plan; how memory is spent comes from `memory`
    memory: MemoryModel = POOL
    context: int | None = None  # tokens per request; None: the model's max_position_embeddings
    tp: int = 1
    dp: int = 1
    pp: int = 1
    dtype: str = "auto"
    kv_dtype: str = "auto"  # the engine's KV dtype flag (--kv-cache-dtype, -ctk)
    kv_dtype_v: str | None = None  # V's dtype when the engine sets it apart (llama.cpp -ctv)
    device: str = "gpu"  # "cpu" for a CPU backend (its own block size)
    gpu_total_bytes: int | None = None  # per GPU
    utilization: float | None = None  # gpu_memory_utilization / mem_fraction_static
    pool_bytes: int | None = None  # a fixed KV budget: --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED
    block_size: int | None = None
    enforce_eager: bool = False
    parallel: int = 1  # an allocating engine's slots (llama.cpp -np)
    measured_floor_bytes: int | None = None  # per GPU, from the last boot of this model+build
    # speculative decoding, as the launch's argv says it (the adapter's `speculation`): its method,
    # and for a separate draft model (vLLM `model`, llama.cpp -md) that model's shape and TP degree
    speculation: dict[str, Any] | None = None
    draft: Arch | None = None
    draft_tp: int | None = None
    draft_problem: str = ""  # why a named draft model could not be read (then it is not planned, and said so)


@dataclass
class Plan:
    engine: str
    model_type: str
    source: str
    layers: dict[str, int]
    context: int
    tp: int
    dp: int
    pp: int
    dtype: str
    kv_dtype: str
    kv_dtype_why: str
    weights_bytes: int
    weights_per_gpu: int
    weights_basis: str
    kv_bytes_per_token: int  # whole model, layers that grow with context
    kv_bytes_per_token_per_gpu: int
    sliding_bytes_per_token_per_gpu: int
    sliding_hold_tokens: int
    state_bytes_per_seq_per_gpu: int
    request_bytes_per_gpu: int  # one request at full context
    block_size: int
    gpu_total_bytes: int | None = None
    utilization: float | None = None
    budget_bytes_per_gpu: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    overhead_basis: str = ""
    pool_bytes_per_gpu: int | None = None
    kv_pool_tokens: int | None = None  # per replica, as the engine would report it
    full_length_requests: float | None = None  # per replica
    need_bytes_per_gpu: int | None = None  # free memory a start needs on each of its GPUs
    need_basis: str = ""
    calibrated: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # what speculative decoding adds (included in the figures above): the draft's KV per token on one GPU
    # and its weights; `draft` says which draft it is (an MTP head of the checkpoint, a draft model)
    draft: str = ""
    draft_kv_bytes_per_token_per_gpu: int = 0
    draft_weights_bytes: int = 0
    draft_basis: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def resolve_dtypes(arch: Arch, inp: PlanInputs) -> tuple[str, str, str | None, str]:
    """(compute dtype, K dtype, V dtype, why). vLLM downcasts fp32 checkpoints to bf16 (its 'auto');
    'auto' KV follows the compute dtype unless the checkpoint forces FP8 KV by its quantization config,
    or the engine has a KV dtype of its own (llama.cpp: f16)."""
    dtype = arch.dtype if inp.dtype == "auto" else inp.dtype
    if inp.memory.fp32_downcast and inp.dtype == "auto" and dtype in ("float32", "fp32"):
        dtype = "bfloat16"
    default = inp.memory.kv_dtype_default
    if default is not None:  # the engine has a KV dtype of its own (llama.cpp: f16, -ctk/-ctv)
        k = default if inp.kv_dtype == "auto" else inp.kv_dtype
        v = inp.kv_dtype_v or k
        who = inp.engine or "the engine"
        return dtype, k, v, f"{who} default {default}" if inp.kv_dtype == "auto" else f"{who} KV dtype flags"
    if inp.kv_dtype != "auto":
        return dtype, inp.kv_dtype, None, "--kv-cache-dtype"
    if arch.kv_dtype_hint:
        return dtype, arch.kv_dtype_hint, None, f"auto, but {arch.kv_dtype_hint_why}"
    return dtype, dtype, None, "auto = model dtype"


def _per_gpu_layers(arch: Arch, kind: str, pp: int) -> float:
    return arch.count(kind) / pp


def kv_bytes(arch: Arch, k_dtype: str, v_dtype: str | None, tp: int = 1, pp: int = 1) -> tuple[float, float]:
    """(growing, sliding) KV bytes per token on one GPU (tp=pp=1: the whole model)."""
    kb = dtype_bytes(k_dtype)
    vb = dtype_bytes(v_dtype or k_dtype)
    kvh = max(1, arch.kv_heads // tp)
    per_attn_layer = kvh * arch.head_dim * (kb + vb)
    grow = _per_gpu_layers(arch, "full", pp) * per_attn_layer
    if arch.count("mla"):
        grow += _per_gpu_layers(arch, "mla", pp) * (int(arch.kv_lora_rank or 0) + int(arch.qk_rope_head_dim or 0)) * kb
    slide = _per_gpu_layers(arch, "sliding", pp) * per_attn_layer
    return grow, slide


def linear_state_bytes(arch: Arch, dtype: str, tp: int = 1, pp: int = 1) -> float:
    """Fixed per-sequence state of the linear-attention layers on one GPU (conv window + SSM matrix)."""
    la = arch.linear
    if la is None or not arch.count("linear"):
        return 0.0
    b = dtype_bytes(dtype)
    conv = (la.conv_kernel - 1) * la.conv_dim / tp * b
    ssm = max(1, la.value_heads // tp) * la.key_head_dim * la.value_head_dim * b
    return _per_gpu_layers(arch, "linear", pp) * (conv + ssm)


def activation_estimate(arch: Arch, inp: PlanInputs, act_bytes: float) -> int:
    """vLLM's profiling peak: one forward of max_num_batched_tokens (hidden states, fused gate/up MLP
    output) plus fp32 logits for max_num_seqs sequences in the sampler warm-up. Rough by design."""
    t = inp.max_num_batched_tokens
    per_token = (4 * arch.hidden + 2 * max(arch.intermediate, arch.hidden) / inp.tp) * act_bytes
    logits = inp.max_num_seqs * arch.vocab * 4 / inp.tp
    return int(t * per_token + logits)


MTP_METHODS = ("mtp",)  # vLLM's method names end so: mtp, deepseek_mtp, qwen3_next_mtp, ...; SGLang's NEXTN


@dataclass
class _Draft:
    """What a speculative draft adds, per token (whole model and one GPU) and in weights (whole, per GPU)."""

    name: str = ""
    grow_all: float = 0.0
    grow: float = 0.0
    slide_all: float = 0.0
    slide: float = 0.0
    weights: int = 0
    weights_gpu: int = 0
    basis: str = ""
    notes: tuple[str, ...] = ()


def _layer_kv(arch: Arch, k_dtype: str, v_dtype: str | None, tp: int) -> float:
    """KV bytes per token of one full-attention (or MLA) layer of `arch` on one GPU."""
    if arch.count("mla"):
        return (int(arch.kv_lora_rank or 0) + int(arch.qk_rope_head_dim or 0)) * dtype_bytes(k_dtype)
    return max(1, arch.kv_heads // tp) * arch.head_dim * (dtype_bytes(k_dtype) + dtype_bytes(v_dtype or k_dtype))


def speculative_draft(arch: Arch, inp: PlanInputs, k_dt: str, v_dt: str | None) -> _Draft:
    """The draft a speculative config runs beside the model. An MTP method runs the checkpoint's own MTP
    layers: one decoder layer each, whose KV joins the pool (vLLM allocates the draft's attention layers in
    the same KV cache); their weights are in the checkpoint's files (vLLM loads them only for MTP), so they
    are added only when the weights were estimated from config.json. A draft model (vLLM `model`, EAGLE
    heads, llama.cpp -md) adds its own weights and KV per token, on `draft_tp` GPUs. n-gram and suffix
    methods draft from the text: nothing to add."""
    spec = inp.speculation or {}
    if not spec:
        return _Draft()
    method = str(spec.get("method") or "")
    tp = inp.draft_tp or inp.tp
    if inp.draft is not None:
        d = inp.draft
        g_all, s_all = kv_bytes(d, k_dt, v_dt)
        g, sl = kv_bytes(d, k_dt, v_dt, tp)
        w = int(d.weights_bytes or 0)
        return _Draft(f"draft model {d.source} ({method or 'draft'}, tp {tp})", g_all, g, s_all, sl, w, _cdiv(w, tp),
                      f"the draft's {d.weights_basis}; its KV per token from its config ({d.count('full') or d.layers} layers)")
    if inp.draft_problem:
        return _Draft(notes=(f"speculative {method or 'draft'}: {inp.draft_problem}; the draft's weights and KV "
                             "are not in this plan",))
    if method.lower().endswith(MTP_METHODS) or method.upper() == "NEXTN":
        n = arch.mtp_layers
        if not n:
            return _Draft(notes=(f"speculative method {method!r}, but config.json declares no MTP layers "
                                 "(mtp_num_hidden_layers / num_nextn_predict_layers): the draft is not planned",))
        per_all, per = _layer_kv(arch, k_dt, v_dt, 1) * n, _layer_kv(arch, k_dt, v_dt, tp) * n
        estimated = not arch.weights_basis.startswith(("weight files", "GGUF"))
        w = arch.mtp_weights_bytes if estimated else 0
        basis = (f"{n} MTP layer{'s' if n != 1 else ''} of the checkpoint: KV as one full-attention layer each"
                 + (f"; weights estimated {w / GiB:.2f} GiB" if estimated else "; weights already in the files"))
        return _Draft(f"MTP head ({n} layer{'s' if n != 1 else ''}, {spec.get('draft_max') or '?'} tokens a step)",
                      per_all, per, 0.0, 0.0, w, _cdiv(w, inp.tp * inp.pp), basis)
    return _Draft(notes=(f"speculative method {method!r} drafts without a model of its own: no memory added",)
                  if method else ())


def compute(arch: Arch, inp: PlanInputs) -> Plan:
    context = int(inp.context or arch.max_context or 0)
    if context <= 0:
        raise ValueError("no context length: set `context` on the model (the config has no max_position_embeddings)")
    dtype, k_dt, v_dt, why = resolve_dtypes(arch, inp)
    tp, pp, dp = inp.tp, inp.pp, inp.dp
    grow_all, slide_all = kv_bytes(arch, k_dt, v_dt)
    grow, slide = kv_bytes(arch, k_dt, v_dt, tp, pp)
    draft = speculative_draft(arch, inp, k_dt, v_dt)
    grow_all, slide_all, grow, slide = (grow_all + draft.grow_all, slide_all + draft.slide_all,
                                        grow + draft.grow, slide + draft.slide)
    state = linear_state_bytes(arch, dtype, tp, pp)
    mem = inp.memory
    bs = inp.block_size or ((mem.cpu_block_size or mem.block_size) if inp.device == "cpu" else mem.block_size)
    window = arch.sliding_window or 0
    if not slide:
        hold = 0
    elif mem.sliding_hold == "window+ubatch":
        hold = min(context, window + UBATCH)
    elif mem.sliding_hold == "window+batched":
        hold = min(context, window - 1 + inp.max_num_batched_tokens)
    else:
        hold = min(context, window)
    grow_tokens = _cdiv(context, bs) * bs
    hold_tokens = (_cdiv(hold, bs) + 1) * bs if (hold and mem.whole_blocks_plus_one) else hold
    request = grow_tokens * grow + hold_tokens * slide + state
    weights = int(arch.weights_bytes or 0) + draft.weights
    weights_gpu = _cdiv(int(arch.weights_bytes or 0), tp * pp) + draft.weights_gpu
    counts = {k: arch.count(k) for k in ("full", "sliding", "mla", "linear") if arch.count(k)}
    plan = Plan(
        engine=inp.engine, model_type=arch.model_type, source=arch.source, layers=counts, context=context,
        tp=tp, dp=dp, pp=pp, dtype=dtype, kv_dtype=k_dt if not v_dt or v_dt == k_dt else f"K {k_dt} / V {v_dt}",
        kv_dtype_why=why, weights_bytes=weights, weights_per_gpu=weights_gpu, weights_basis=arch.weights_basis,
        kv_bytes_per_token=math.ceil(grow_all + slide_all), kv_bytes_per_token_per_gpu=math.ceil(grow),
        sliding_bytes_per_token_per_gpu=math.ceil(slide), sliding_hold_tokens=hold,
        state_bytes_per_seq_per_gpu=math.ceil(state), request_bytes_per_gpu=math.ceil(request), block_size=bs,
        gpu_total_bytes=inp.gpu_total_bytes, notes=list(arch.notes) + list(draft.notes), draft=draft.name,
        draft_kv_bytes_per_token_per_gpu=math.ceil(draft.grow + draft.slide), draft_weights_bytes=draft.weights,
        draft_basis=draft.basis,
    )
    if mem.kind == "allocate":
        _allocate(plan, arch, inp, grow, slide, state)
    else:
        _pool(plan, arch, inp, grow, slide, state, dtype)
    if arch.max_context and context > arch.max_context:
        plan.notes.append(f"context {context:,} is above the model's max_position_embeddings {arch.max_context:,}"
                          + (f" even with its rope scaling ({arch.rope_scaling})" if arch.rope_scaling else ""))
    elif arch.trained_context and context > arch.trained_context:
        plan.notes.append(f"context {context:,} is past the {arch.trained_context:,} positions the model was trained "
                          f"on, within its rope scaling ({arch.rope_scaling}, up to {arch.max_context:,}): "
                          "a needle gate at this length says more than the plan can")
    return plan


def _allocate(plan: Plan, arch: Arch, inp: PlanInputs, grow: float, slide: float, state: float) -> None:
    """An allocating engine (llama-server) takes its whole cache at boot: context × slots for growing layers."""
    slots = max(1, inp.parallel)
    ctx_total = plan.context * slots
    kv = ctx_total * grow + min(ctx_total, slots * plan.sliding_hold_tokens) * slide + slots * state
    compute_buf = int(UBATCH * (arch.vocab + 8 * arch.hidden) * 4)  # logits + activations, f32
    plan.kv_pool_tokens = ctx_total
    plan.full_length_requests = float(slots)
    plan.pool_bytes_per_gpu = int(kv)
    plan.activation_bytes, plan.non_torch_bytes, plan.cuda_graph_bytes = compute_buf, int(0.3 * GiB), 0
    plan.overhead_basis = "estimate: compute buffer (ubatch 512 × (vocab + 8 × hidden) × 4 B) + 0.3 GiB CUDA context"
    n = plan.tp * plan.pp  # layers split over its GPUs
    plan.need_bytes_per_gpu = _cdiv(plan.weights_bytes + int(kv) + compute_buf, n) + int(0.3 * GiB)
    plan.need_basis = "planned: weights + KV for context × slots + compute buffer + CUDA context"
    if inp.measured_floor_bytes:
        plan.calibrated = {"need_bytes_per_gpu": inp.measured_floor_bytes, "basis": "measured peak of the last boot"}


def _pool(plan: Plan, arch: Arch, inp: PlanInputs, grow: float, slide: float, state: float, dtype: str) -> None:
    if inp.pool_bytes is not None:
        pool = inp.pool_bytes
        plan.overhead_basis = "fixed KV budget (--kv-cache-memory-bytes / VLLM_CPU_KVCACHE_SPACE)"
    elif inp.gpu_total_bytes is None:
        plan.notes.append("no GPU size known: pool not predicted (pass --gpu-gib, or run where NVML sees a GPU)")
        return
    else:
        util = inp.memory.required_share(inp.utilization) or POOL_DEFAULT_SHARE
        budget = int(inp.gpu_total_bytes * util)
        plan.utilization, plan.budget_bytes_per_gpu = util, budget
        if inp.memory.kind == "static-share":
            act = non_torch = graphs = 0
            plan.overhead_basis = (f"{inp.memory.share_key} covers weights + KV; activations live outside it")
        else:
            act = activation_estimate(arch, inp, dtype_bytes(dtype))
            non_torch = NON_TORCH_BYTES + (NCCL_BYTES if inp.tp * inp.pp > 1 else 0)
            graphs = 0 if inp.enforce_eager else CUDA_GRAPH_BYTES
            plan.overhead_basis = ("estimate: activation peak for max_num_batched_tokens "
                                   f"{inp.max_num_batched_tokens} + non-torch + CUDA graphs"
                                   + (" (enforce_eager: none)" if inp.enforce_eager else ""))
        plan.activation_bytes, plan.non_torch_bytes, plan.cuda_graph_bytes = act, non_torch, graphs
        pool = budget - plan.weights_per_gpu - act - non_torch - graphs
        # vLLM refuses to start unless this much is free on each GPU (ENGINES.md)
        plan.need_bytes_per_gpu = budget
        plan.need_basis = f"{inp.memory.share_key} {util} × total (the engine checks free ≥ this at start)"
        if inp.measured_floor_bytes is not None:
            cal_pool = budget - inp.measured_floor_bytes
            plan.calibrated = {"pool_bytes_per_gpu": cal_pool, "floor_bytes_per_gpu": inp.measured_floor_bytes,
                               **_tokens(plan, cal_pool, grow, slide, state),
                               "basis": "floor (weights + activations + graphs) measured at the last boot"}
    plan.pool_bytes_per_gpu = int(pool)
    if pool <= 0:
        plan.notes.append("no room for any KV cache: weights and overhead exceed the budget")
        plan.kv_pool_tokens, plan.full_length_requests = 0, 0.0
        return
    t = _tokens(plan, pool, grow, slide, state)
    plan.kv_pool_tokens, plan.full_length_requests = t["kv_pool_tokens"], t["full_length_requests"]
    if plan.full_length_requests < 1:
        plan.notes.append(f"not even one {plan.context:,}-token request fits: the engine will refuse to start")


def _tokens(plan: Plan, pool: float, grow: float, slide: float, state: float) -> dict[str, Any]:
    """Whole blocks, as vLLM counts them; for dense models this reproduces its log line exactly."""
    if pool <= 0:
        return {"kv_pool_tokens": 0, "full_length_requests": 0.0}
    bs, L = plan.block_size, plan.context
    if not slide and not state and grow:
        blocks = int(pool // (bs * grow))
        conc = blocks / _cdiv(L, bs)
    else:
        conc = pool / plan.request_bytes_per_gpu
    return {"kv_pool_tokens": int(conc * L), "full_length_requests": round(conc, 2)}

