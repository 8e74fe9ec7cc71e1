"""The planner against figures computed by hand (the arithmetic is written out beside each expectation).

Fixtures are the published config.json shapes of four architectures, trimmed to the keys that matter:
dense GQA (Llama 3.1 8B), MLA (DeepSeek V3), sliding window (Gemma 3 27B), hybrid linear attention
(Qwen3-Next 80B-A3B). Plus the real SmolLM2 conversion whose vLLM CPU boot printed 93,184 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servedeck.gpu.arch import from_gguf, from_hf_config
from servedeck.gpu.gguf_header import read_header
from servedeck.engines import get_engine
from servedeck.gpu.plan import PlanInputs as _PlanInputs
from servedeck.gpu.plan import compute


def PlanInputs(engine: str = "vllm", **kw) -> _PlanInputs:
    """The planner's inputs for a launch on `engine`: its adapter says how it spends memory."""
    return _PlanInputs(engine=engine, memory=get_engine(engine).memory, **kw)

FIX = Path(__file__).parent / "fixtures"
GiB = 1024**3


def arch(name: str, weights: int | None = None):
    return from_hf_config(json.loads((FIX / f"{name}.json").read_text()), name, weights)


# ---------------------------------------------------------------- dense GQA: Llama 3.1 8B
def test_llama_dense_gqa_kv_and_weights():
    a = arch("llama3-8b")
    assert a.layer_kinds == ("full",) * 32 and a.head_dim == 4096 // 32 == 128
    # params: embed + lm_head 2 × 128256 × 4096; per layer q,o 2 × 4096², k,v 2 × 4096 × 1024, MLP 3 × 4096 × 14336
    params = 2 * 128256 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert params == 8_029_995_008
    assert a.weights_bytes == params * 2  # bf16
    p = compute(a, PlanInputs(context=8192))
    assert p.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB per token
    assert p.request_bytes_per_gpu == 8192 * 131_072  # 1 GiB per 8K request


def test_llama_tp_splits_kv_heads_and_replicates_below_kv_heads():
    a = arch("llama3-8b")
    assert compute(a, PlanInputs(context=8192, tp=2)).kv_bytes_per_token_per_gpu == 2 * 32 * 4 * 128 * 2
    # tp 16 > 8 KV heads: each GPU keeps one (replicated) head
    assert compute(a, PlanInputs(context=8192, tp=16)).kv_bytes_per_token_per_gpu == 2 * 32 * 1 * 128 * 2
    # pp 2: half the layers per GPU, half the weights
    p = compute(a, PlanInputs(context=8192, pp=2))
    assert p.kv_bytes_per_token_per_gpu == 2 * 16 * 8 * 128 * 2
    assert p.weights_per_gpu == 16_059_990_016 // 2


def test_llama_vllm_pool_on_an_80_gib_gpu():
    a = arch("llama3-8b")
    p = compute(a, PlanInputs(context=8192, gpu_total_bytes=80 * GiB, utilization=0.9))
    budget = int(80 * GiB * 0.9)  # 77,309,411,328
    act = 8192 * (4 * 4096 + 2 * 14336) * 2 + 256 * 128256 * 4  # batched tokens × activations + fp32 logits
    assert p.activation_bytes == act == 869_531_648
    pool = budget - 16_059_990_016 - act - GiB // 2 - GiB  # weights, activations, non-torch, CUDA graphs
    assert p.pool_bytes_per_gpu == pool == 58_769_276_928
    blocks = pool // (16 * 131_072)  # 28,023 whole 16-token blocks
    assert p.kv_pool_tokens == blocks * 16 == 448_368
    assert p.full_length_requests == round(blocks / 512, 2) == 54.73
    assert p.need_bytes_per_gpu == budget


def test_dp_does_not_change_per_gpu_figures():
    a = arch("llama3-8b")
    one = compute(a, PlanInputs(context=8192, gpu_total_bytes=80 * GiB, utilization=0.9))
    four = compute(a, PlanInputs(context=8192, dp=4, gpu_total_bytes=80 * GiB, utilization=0.9))
    assert (one.kv_pool_tokens, one.weights_per_gpu) == (four.kv_pool_tokens, four.weights_per_gpu)


def test_fp8_kv_halves_bytes_per_token():
    a = arch("llama3-8b")
    p = compute(a, PlanInputs(context=8192, kv_dtype="fp8"))
    assert p.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1 and p.kv_dtype == "fp8"


def test_checkpoint_forced_fp8_kv_is_reported_with_its_reason():
    """Seed 004: FP8 KV "on anyway and not by choice" because config.json declares a kv_cache_scheme."""
    a = arch("qwen-fp8kv")
    assert a.layer_kinds == ("full",) * 36  # use_sliding_window false: the window is ignored
    p = compute(a, PlanInputs(context=40960))
    assert p.kv_dtype == "fp8" and "kv_cache_scheme" in p.kv_dtype_why
    assert p.kv_bytes_per_token == 2 * 36 * 8 * 128 * 1
    # an explicit --kv-cache-dtype wins
    assert compute(a, PlanInputs(context=40960, kv_dtype="bfloat16")).kv_bytes_per_token == 2 * 36 * 8 * 128 * 2


# ---------------------------------------------------------------- MLA: DeepSeek V3
def test_deepseek_mla_latent_cache_replicated_across_tp():
    a = arch("deepseek-v3")
    assert a.layer_kinds == ("mla",) * 61
    p = compute(a, PlanInputs(context=163840))
    assert p.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272  # no factor 2 for K/V
    p8 = compute(a, PlanInputs(context=163840, tp=8, kv_dtype="fp8"))
    assert p8.kv_bytes_per_token_per_gpu == 61 * 576 * 1 == 35_136  # the same on every TP rank
    assert p8.request_bytes_per_gpu == 163840 * 35_136


def test_deepseek_weights_estimate_counts_experts_at_fp8():
    a = arch("deepseek-v3")
    h, L = 7168, 61
    mla = (h * 1536 + 1536 * 128 * (128 + 64)) + h * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * h
    dense_mlp = 3 * h * 18432
    moe_mlp = 256 * 3 * h * 2048 + 3 * h * 2048 + h * 256  # routed experts, one shared expert, router
    linear = L * mla + 3 * dense_mlp + (L - 3) * moe_mlp
    embed = 2 * 129280 * h
    assert round((linear + embed) / 1e9) == 671  # DeepSeek V3 publishes 671 B parameters
    assert a.weights_bytes == linear * 1 + embed * 2  # fp8 linear layers, bf16 embeddings
    assert a.notes  # an estimate for a quantised checkpoint says it is rough


# ---------------------------------------------------------------- sliding window: Gemma 3 27B
def test_gemma3_sliding_window_layers_hold_only_the_window():
    a = arch("gemma3-27b")  # nested text_config, pattern 6: layers 5, 11, …, 59 are global
    assert a.count("full") == 10 and a.count("sliding") == 52 and a.sliding_window == 1024
    p = compute(a, PlanInputs(context=131072))
    per_layer = 2 * 16 * 128 * 2  # 8,192 B per token per layer
    assert p.kv_bytes_per_token_per_gpu == 10 * per_layer == 81_920
    assert p.sliding_bytes_per_token_per_gpu == 52 * per_layer == 425_984
    # vLLM keeps window − 1 + max_num_batched_tokens tokens, in whole 16-token blocks, plus one block
    assert p.sliding_hold_tokens == 1024 - 1 + 8192 == 9215
    hold = (-(-9215 // 16) + 1) * 16  # 577 blocks = 9,232 tokens
    assert p.request_bytes_per_gpu == 131072 * 81_920 + hold * 425_984 == 14_670_102_528
    # vs 131,072 × 507,904 = 62 GiB if every layer grew with context
    assert p.kv_bytes_per_token == 62 * per_layer


def test_gemma3_pool_concurrency():
    a = arch("gemma3-27b", weights=54_000_000_000)
    p = compute(a, PlanInputs(context=131072, gpu_total_bytes=141 * GiB, utilization=0.9))
    assert p.full_length_requests == round(p.pool_bytes_per_gpu / 14_670_102_528, 2)
    assert p.kv_pool_tokens == int(p.pool_bytes_per_gpu / 14_670_102_528 * 131072)


# ---------------------------------------------------------------- hybrid: Qwen3-Next 80B-A3B
def test_qwen3_next_hybrid_only_full_layers_grow():
    a = arch("qwen3-next-80b")
    assert a.count("full") == 12 and a.count("linear") == 36  # every 4th layer is full attention
    p = compute(a, PlanInputs(context=262144))
    assert p.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2 == 24_576
    conv_dim = 2 * 16 * 128 + 32 * 128  # q, k and v channels through the short convolution = 8,192
    state = 36 * ((4 - 1) * conv_dim * 2 + 32 * 128 * 128 * 2)  # conv window + SSM matrix, bf16
    assert p.state_bytes_per_seq_per_gpu == state == 39_518_208  # ≈ 37.7 MiB per sequence, any length
    assert p.request_bytes_per_gpu == 262144 * 24_576 + state


def test_qwen3_next_tp2_splits_heads_and_state():
    p = compute(arch("qwen3-next-80b"), PlanInputs(context=262144, tp=2))
    assert p.kv_bytes_per_token_per_gpu == 12 * 2 * 1 * 256 * 2 == 12_288
    assert p.state_bytes_per_seq_per_gpu == 36 * (3 * 8192 // 2 * 2 + 16 * 128 * 128 * 2) == 19_759_104


# ---------------------------------------------------------------- engines and edges
def test_smollm2_vllm_cpu_prediction_matches_its_boot_line():
    """ENGINES.md: vLLM CPU printed `CPU KV cache size: 93,184 tokens, Maximum concurrency for 8,192
    tokens per request: 11.38x` for this model with a 2 GiB KV space (fp32 checkpoint → bf16)."""
    cfg = json.loads((FIX / "smollm2-135m-hf.json").read_text())
    a = from_hf_config(cfg, "smollm2")
    p = compute(a, PlanInputs(context=8192, pool_bytes=2 * GiB, device="cpu"))
    assert p.dtype == "bfloat16" and p.block_size == 128
    assert p.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    assert p.kv_pool_tokens == (2 * GiB // (128 * 23_040)) * 128 == 93_184
    assert p.full_length_requests == 11.38


def test_llamacpp_kv_for_context_times_slots():
    a = arch("llama3-8b", weights=4_920_000_000)
    p = compute(a, PlanInputs(engine="llamacpp", context=8192, parallel=4))
    assert p.kv_pool_tokens == 8192 * 4 and p.full_length_requests == 4
    assert p.pool_bytes_per_gpu == 8192 * 4 * 131_072 * 1 // 1  # f16 K and V
    q8 = compute(a, PlanInputs(engine="llamacpp", context=8192, kv_dtype="q8_0"))
    assert q8.kv_bytes_per_token == int(2 * 32 * 8 * 128 * 34 / 32)


def test_context_defaults_to_max_position_and_warns_when_above():
    a = arch("llama3-8b")
    assert compute(a, PlanInputs()).context == 131072
    p = compute(a, PlanInputs(context=200_000))
    assert any("above the model's max_position_embeddings" in n for n in p.notes)


def test_weights_bigger_than_budget_leave_no_pool():
    p = compute(arch("llama3-8b"), PlanInputs(context=8192, gpu_total_bytes=16 * GiB, utilization=0.9))
    assert p.kv_pool_tokens == 0 and any("no room" in n for n in p.notes)


def test_unknown_config_is_a_clear_error():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        from_hf_config({"model_type": "bert"}, "x")


# ---------------------------------------------------------------- GGUF
def test_gguf_arch_from_a_written_header(tmp_path):
    from gguf_writer import write_gguf

    path = write_gguf(tmp_path / "m.gguf", "gemma3", {
        "gemma3.block_count": 18, "gemma3.embedding_length": 640, "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 256,
        "gemma3.context_length": 32768, "gemma3.attention.sliding_window": 512,
    }, tensor_bytes=1000)
    a = from_gguf(read_header(path), str(path))
    # llama.cpp's gemma3 pattern: layer i slides when i % 6 < 5 → 3 global layers of 18
    assert a.count("full") == 3 and a.count("sliding") == 15
    p = compute(a, PlanInputs(engine="llamacpp", context=32768))
    assert p.kv_bytes_per_token_per_gpu == 3 * 1 * 256 * (2 + 2)
    assert p.sliding_hold_tokens == 512 + 512  # window + ubatch
    assert a.weights_bytes == 1000


SMOL_GGUF = Path.home() / ".cache/servedeck/models/smollm2-135m-instruct-q4_1.gguf"


@pytest.mark.skipif(not SMOL_GGUF.exists(), reason="scripts/prepare-models.sh has not been run")
def test_real_smollm2_gguf():
    h = read_header(SMOL_GGUF)
    a = from_gguf(h, str(SMOL_GGUF))
    assert (a.layers, a.kv_heads, a.head_dim) == (30, 3, 64)
    assert a.weights_bytes == 96_576_768  # the same figure gguf-py's GGUFReader sums from tensor sizes
    p = compute(a, PlanInputs(engine="llamacpp", context=8192))
    assert p.pool_bytes_per_gpu == 8192 * 2 * 30 * 3 * 64 * 2  # 180 MiB of f16 KV
