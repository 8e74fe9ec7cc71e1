"""A model's shape as the memory planner needs it, read from an HF config.json or a GGUF header.

Pure: dicts in, `Arch` out. Finding the files (local dir, HF cache, .gguf) is `source.py`'s job.

Each layer has one kind, because that decides how its KV grows:
    full     grows with context: 2 × kv_heads × head_dim per token
    sliding  holds at most the window (Gemma 2/3, gpt-oss, Mistral v0.1)
    mla      DeepSeek's latent cache: (kv_lora_rank + qk_rope_head_dim) per token, no K/V pair
    linear   Qwen3-Next's Gated DeltaNet: no per-token KV, a fixed conv + SSM state per sequence
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servedeck.gpu.gguf_header import GGUFHeader

DTYPE_BYTES = {
    "float32": 4.0, "fp32": 4.0, "f32": 4.0, "float": 4.0,
    "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "f16": 2.0, "half": 2.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "fp8_ds_mla": 1.0, "int8": 1.0,
    # llama.cpp cache types (-ctk/-ctv): blocks of 32 values with a scale
    "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32,
}


def dtype_bytes(name: str) -> float:
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(sorted(DTYPE_BYTES))})") from None


@dataclass(frozen=True)
class LinearAttn:
    """Gated DeltaNet geometry (Qwen3-Next `linear_*` keys)."""

    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim


@dataclass(frozen=True)
class Arch:
    source: str  # where this was read from (a path, or "repo@revision")
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str  # the checkpoint's compute dtype (config torch_dtype/dtype)
    layer_kinds: tuple[str, ...]
    vocab: int = 0
    intermediate: int = 0
    max_context: int | None = None
    sliding_window: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    linear: LinearAttn | None = None
    weights_bytes: int | None = None  # from the weight files when present, else estimated
    weights_basis: str = ""
    kv_dtype_hint: str | None = None  # KV dtype the checkpoint forces (quantization_config.kv_cache_scheme)
    kv_dtype_hint_why: str = ""
    quantization: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the trained window (max_position_embeddings) when rope scaling stretches it: max_context is then
    # the scaled one (YaRN factor × original_max_position_embeddings), and rope_scaling says how
    trained_context: int | None = None
    rope_scaling: str = ""
    # multi-token-prediction layers the checkpoint carries (mtp_num_hidden_layers, num_nextn_predict_layers):
    # a speculative config naming MTP runs them as a draft, with their own KV cache and weights
    mtp_layers: int = 0
    mtp_weights_bytes: int = 0  # estimated from config.json (what they add when weights are estimated too)

    def count(self, kind: str) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Multimodal checkpoints (Gemma 3, Qwen VL) nest the language model under text_config."""
    inner = cfg.get("text_config")
    if isinstance(inner, dict) and ("num_hidden_layers" in inner or "hidden_size" in inner):
        merged = dict(inner)
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if key not in merged and key in cfg:
                merged[key] = cfg[key]
        merged.setdefault("model_type", cfg.get("model_type", ""))
        return merged
    return cfg


# RoPE types whose `factor` stretches the trained window (transformers' modeling_rope_utils); "default"
# and the rest leave it as trained. YaRN-like types stretch original_max_position_embeddings.
_STRETCHING = {"yarn", "deepseek_yarn", "dynamic", "linear", "longrope", "llama3"}


def rope_limit(c: dict[str, Any]) -> tuple[int | None, int | None, str]:
    """(the longest context the rope scaling allows, the trained window, how) from `rope_parameters`
    (transformers 5) or `rope_scaling` (4.x), flat or one dict per layer type. No stretching scaling:
    (max_position_embeddings, None, "")."""
    trained = c.get("max_position_embeddings")
    rp = c.get("rope_parameters") or c.get("rope_scaling")
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        rp = next((v for v in rp.values() if v.get("factor")), {})  # per layer type: one factor for all
    if not isinstance(rp, dict):
        return trained, None, ""
    kind = str(rp.get("rope_type") or rp.get("type") or "default")
    factor = rp.get("factor")
    if kind not in _STRETCHING or not isinstance(factor, (int, float)) or factor <= 1:
        return trained, None, ""
    original = rp.get("original_max_position_embeddings") or c.get("original_max_position_embeddings") or trained
    if not original:
        return trained, None, ""
    scaled = int(original * factor)
    how = f"{kind} ×{factor:g} of {int(original):,} trained positions"
    return max(scaled, int(trained or 0)), int(original), how


def _layer_kinds(c: dict[str, Any], layers: int) -> tuple[str, ...]:
    if c.get("kv_lora_rank"):
        return ("mla",) * layers
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        mapping = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear",
                   "chunked_attention": "sliding"}
        return tuple(mapping.get(t, "full") for t in types)
    if c.get("full_attention_interval"):  # Qwen3-Next: every Nth layer is full attention, the rest linear
        n = int(c["full_attention_interval"])
        return tuple("full" if (i + 1) % n == 0 else "linear" for i in range(layers))
    window = c.get("sliding_window")
    if window and c.get("use_sliding_window", True) is not False:
        pattern = c.get("sliding_window_pattern")
        if pattern is None and str(c.get("model_type", "")).startswith("gemma2"):
            pattern = 2
        if pattern:  # HF Gemma: layer i slides unless (i + 1) % pattern == 0
            return tuple("full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(layers))
        return ("sliding",) * layers
    return ("full",) * layers


def _kv_hint(c: dict[str, Any], extra: dict[str, Any] | None) -> tuple[str | None, str]:
    """FP8 KV that a checkpoint turns on by itself (the seed's trap: on 'not by choice')."""
    q = c.get("quantization_config") or {}
    scheme = q.get("kv_cache_scheme")
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
        return "fp8", "config.json quantization_config.kv_cache_scheme declares 8-bit float KV"
    algo = q.get("kv_cache_quant_algo") or ((extra or {}).get("quantization") or {}).get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo.upper() == "FP8":
        return "fp8", "the checkpoint's quantization config declares kv_cache_quant_algo FP8"
    return None, ""


# bits per weight of a quantised checkpoint's linear layers, scales included, when only config.json is present
_QUANT_BITS = {"fp8": 8, "fbgemm_fp8": 8, "mxfp4": 4.25, "awq": 4.25, "gptq": 4.25, "bitsandbytes": 4.5}


def _quant_bits(q: dict[str, Any]) -> float:
    method = str(q.get("quant_method", ""))
    if method == "modelopt":  # NVFP4: 4-bit values plus an FP8 scale per 16 → 4.5 bits
        return 8.0 if "FP8" in str(q.get("quant_algo", "")).upper() else 4.5
    if q.get("bits"):
        return float(q["bits"])
    return _QUANT_BITS.get(method, 8.0)


def estimate_params(c: dict[str, Any]) -> tuple[int, int]:
    """(linear-layer params, embedding params) from config.json alone: used only when no weight files are
    at hand (config-only fixtures, a repo not yet downloaded). Norms and biases are ignored (< 0.1%)."""
    h, L = int(c["hidden_size"]), int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    vocab = int(c.get("vocab_size", 0))
    inter = int(c.get("intermediate_size", 0))
    kinds = _layer_kinds(c, L)
    embed = vocab * h * (1 if c.get("tie_word_embeddings", False) else 2)

    def attn(kind: str) -> int:
        if kind == "mla":
            nope, rope, vd = int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]), int(c["v_head_dim"])
            qr, kvr = c.get("q_lora_rank"), int(c["kv_lora_rank"])
            q = h * int(qr) + int(qr) * heads * (nope + rope) if qr else h * heads * (nope + rope)
            return q + h * (kvr + rope) + kvr * heads * (nope + vd) + heads * vd * h
        if kind == "linear":
            la = linear_attn(c)
            assert la is not None
            kd, vd = la.key_heads * la.key_head_dim, la.value_heads * la.value_head_dim
            return h * (2 * kd + 2 * vd) + h * 2 * la.value_heads + la.conv_dim * la.conv_kernel + vd * h
        q_out = heads * hd * (2 if c.get("attn_output_gate") else 1)  # Qwen3-Next gates its attention output
        return h * q_out + 2 * h * kv * hd + heads * hd * h

    n_experts = int(c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0)
    moe_inter = int(c.get("moe_intermediate_size") or inter)
    shared = int(c.get("n_shared_experts") or 0) * moe_inter + int(c.get("shared_expert_intermediate_size") or 0)
    first_dense = int(c.get("first_k_dense_replace") or 0)
    dense_only = set(c.get("mlp_only_layers") or [])

    def mlp(i: int) -> int:
        if n_experts and i >= first_dense and i not in dense_only:
            return n_experts * 3 * h * moe_inter + 3 * h * shared + h * n_experts
        return 3 * h * inter

    linear = sum(attn(k) + mlp(i) for i, k in enumerate(kinds))
    return linear, embed


def mtp_layers(c: dict[str, Any]) -> int:
    """How many multi-token-prediction layers config.json declares (vLLM reads mtp_num_hidden_layers
    for Qwen3.5-style checkpoints and num_nextn_predict_layers for DeepSeek, GLM, Qwen3-Next, MiMo ...)."""
    n = c.get("mtp_num_hidden_layers") or c.get("num_nextn_predict_layers") or 0
    return int(n) if isinstance(n, (int, float)) and n > 0 else 0


def estimate_mtp_params(c: dict[str, Any]) -> int:
    """Parameters of the MTP layers: each is one decoder layer of the model's own kind (full attention or
    MLA; MoE where the model is) plus the projection that joins the embedding to the hidden state (2h × h)
    and its norms. Estimated like estimate_params: a checkpoint's files hold the exact figure."""
    n = mtp_layers(c)
    if not n:
        return 0
    one = dict(c, num_hidden_layers=1, layer_types=None, full_attention_interval=None, sliding_window=None,
               first_k_dense_replace=0, mlp_only_layers=[], vocab_size=0)
    layer, _ = estimate_params(one)
    h = int(c["hidden_size"])
    return n * (layer + 2 * h * h + 2 * h)


def linear_attn(c: dict[str, Any]) -> LinearAttn | None:
    if not c.get("linear_num_value_heads"):
        return None
    return LinearAttn(
        key_heads=int(c["linear_num_key_heads"]),
        value_heads=int(c["linear_num_value_heads"]),
        key_head_dim=int(c["linear_key_head_dim"]),
        value_head_dim=int(c["linear_value_head_dim"]),
        conv_kernel=int(c.get("linear_conv_kernel_dim", 4)),
    )


def with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """config.json as the engine sees it after its overrides (vLLM's --hf-overrides): a nested config
    (`text_config`, any `*_config` table) is updated key by key, any other value is replaced whole, as
    vLLM 0.32's `_apply_dict_overrides` does (so `rope_parameters` is the override's, not a merge)."""
    out = dict(raw)
    for key, value in overrides.items():
        if isinstance(value, dict) and key.endswith("_config") and isinstance(out.get(key), dict):
            out[key] = with_overrides(out[key], value)
        else:
            out[key] = value
    return out


def from_hf_config(
    raw: dict[str, Any],
    source: str,
    weights_bytes: int | None = None,
    extra_quant: dict[str, Any] | None = None,
) -> Arch:
    """`raw` is config.json as loaded (with the launch's overrides applied: `with_overrides`);
    `weights_bytes` the weight files' size when known; `extra_quant` an hf_quant_config.json (ModelOpt)
    when the snapshot has one."""
    c = _text_config(raw)
    try:
        L, h, heads = int(c["num_hidden_layers"]), int(c["hidden_size"]), int(c["num_attention_heads"])
    except KeyError as e:
        raise ValueError(f"{source}: config.json has no {e.args[0]}: not a decoder config the planner knows") from None
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").replace("torch.", "")
    kinds = _layer_kinds(c, L)
    hint, why = _kv_hint(c, extra_quant)
    q = c.get("quantization_config") or {}
    qmethod = q.get("quant_method") if isinstance(q, dict) else None
    notes: list[str] = []
    if weights_bytes is not None:
        basis = "weight files on disk"
    else:
        lin, emb = estimate_params(c)
        bits = _quant_bits(q) if qmethod else None
        wb = dtype_bytes(dtype)
        weights_bytes = int(lin * (bits / 8 if bits else wb) + emb * wb)
        basis = f"estimated from config.json ({(lin + emb) / 1e9:.2f} B params"
        basis += f", {qmethod} at {bits:g} bits)" if bits else f" × {wb:g} B)"
        if qmethod:
            notes.append("weights estimated for a quantised checkpoint without its files: treat as rough")
    window = c.get("sliding_window") if "sliding" in kinds else None
    longest, trained, how = rope_limit(c)
    mtp_bytes = int(estimate_mtp_params(c) * ((_quant_bits(q) / 8) if qmethod else dtype_bytes(dtype))) \
        if mtp_layers(c) else 0
    return Arch(
        source=source,
        model_type=str(c.get("model_type", "")),
        layers=L, hidden=h, heads=heads, kv_heads=kv, head_dim=hd, dtype=dtype, layer_kinds=kinds,
        vocab=int(c.get("vocab_size", 0)), intermediate=int(c.get("intermediate_size", 0)),
        max_context=longest, trained_context=trained, rope_scaling=how,
        mtp_layers=mtp_layers(c), mtp_weights_bytes=mtp_bytes,
        sliding_window=int(window) if window else None,
        kv_lora_rank=c.get("kv_lora_rank"), qk_rope_head_dim=c.get("qk_rope_head_dim"),
        linear=linear_attn(c) if "linear" in kinds else None,
        weights_bytes=weights_bytes, weights_basis=basis,
        kv_dtype_hint=hint, kv_dtype_hint_why=why, quantization=qmethod, notes=tuple(notes),
    )


# llama.cpp's default sliding-window patterns (src/llama-model.cpp set_swa_pattern): layer i slides when
# i % n < n - 1. Same layers as HF's (i + 1) % n != 0.
_GGUF_SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "gpt-oss": 2, "cohere2": 4}


def from_gguf(header: GGUFHeader, source: str) -> Arch:
    a = header.architecture
    get = header.arch_key
    L = get("block_count")
    if not a or L is None:
        raise ValueError(f"{source}: GGUF header names no architecture/block_count")
    L, h, heads = int(L), int(get("embedding_length", 0)), int(get("attention.head_count", 1) or 1)
    kv = get("attention.head_count_kv", heads)
    if isinstance(kv, list):  # per-layer counts (some hybrids): planning uses the largest
        kv = max(int(x) for x in kv) if kv else heads
    hd = int(get("attention.key_length") or (h // heads if heads else 0))
    window = get("attention.sliding_window")
    kinds: tuple[str, ...] = ("full",) * L
    if window:
        pat = get("attention.sliding_window_pattern")
        if isinstance(pat, list) and len(pat) == L:
            kinds = tuple("sliding" if x else "full" for x in pat)
        else:
            n = int(pat) if isinstance(pat, int) else _GGUF_SWA_PATTERN.get(a, 0)
            kinds = tuple("sliding" if (n == 0 or i % n < n - 1) else "full" for i in range(L))
    mla_rank = get("attention.kv_lora_rank")
    if mla_rank:
        kinds = ("mla",) * L
    return Arch(
        source=source, model_type=a, layers=L, hidden=h, heads=heads, kv_heads=int(kv), head_dim=hd,
        dtype="float16",  # llama.cpp computes and caches in f16 unless told otherwise (-ctk/-ctv)
        layer_kinds=kinds, vocab=int(get("vocab_size", 0) or 0),
        intermediate=int(get("feed_forward_length", 0) or 0) if not isinstance(get("feed_forward_length"), list) else 0,
        max_context=get("context_length"), sliding_window=int(window) if window else None,
        kv_lora_rank=int(mla_rank) if mla_rank else None,
        qk_rope_head_dim=get("rope.dimension_count") if mla_rank else None,
        weights_bytes=header.tensor_bytes, weights_basis="GGUF tensor data",
    )
