#!/usr/bin/env python3
"""Write a small random-weight llama GGUF that llama-server loads: for the GPU proof run, where the
PyPI-shipped models are too large to carry (the device tool moves at most 64 MiB a call).

Its answers are noise; what it is for is real GPU memory held by a real llama-server process
(KV cache grows with -c: 2 x layers x kv_heads x head_dim x 2 bytes per token). The vocabulary is
SentencePiece-style byte tokens, so any text tokenizes.

    python3 scripts/make-tiny-gguf.py OUT.gguf [--layers 8 --hidden 1024 --heads 8 --kv-heads 8] [--fast]

--fast fills every tensor from one random block, repeated (an 8B shape in ~18 s instead of ~4 min);
the arithmetic the GPU does, and so the speed, is the same.
"""

from __future__ import annotations

import argparse

import numpy as np
import gguf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--context", type=int, default=1048576)
    ap.add_argument("--fast", action="store_true", help="tile one random block instead of drawing every weight")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("servedeck-tiny-random-llama")
    w.add_context_length(a.context)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(a.hidden // a.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # vocab: <unk> <s> </s> then the 256 byte tokens, SentencePiece style
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    v, h, f = len(tokens), a.hidden, a.ffn
    kv = a.kv_heads * (h // a.heads)

    block = (rng.standard_normal(1 << 20) * 0.02).astype(np.float16)

    def t(name: str, *shape: int) -> None:
        if a.fast:
            w.add_tensor(name, np.resize(block, shape))
        else:
            w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16))

    t("token_embd.weight", v, h)
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    t("output.weight", v, h)
    for i in range(a.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", h, h)
        t(f"blk.{i}.attn_k.weight", kv, h)
        t(f"blk.{i}.attn_v.weight", kv, h)
        t(f"blk.{i}.attn_output.weight", h, h)
        t(f"blk.{i}.ffn_gate.weight", f, h)
        t(f"blk.{i}.ffn_up.weight", f, h)
        t(f"blk.{i}.ffn_down.weight", h, f)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
