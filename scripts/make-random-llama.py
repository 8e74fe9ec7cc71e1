"""A random-weight Llama model in Hugging Face layout (safetensors, config.json, a tokenizer copied from a
folder that has one), for GPU runs whose figures are speeds and never answers: the device image can write
one of Llama-3-8B's shape in about 20 s (15 GiB in bf16) where carrying real weights would take many calls.
Greedy answers of such a model are still deterministic, so "identical after a wake" is a real check.

    python scripts/make-random-llama.py OUT_DIR --tokenizer DIR [--seed 0] [--layers 32 --hidden 4096
        --heads 32 --kv-heads 8 --ffn 14336 --context 8192] [--dtype bfloat16]

The vocabulary is the tokenizer's (SmolLM2's: 49,152). Needs torch and transformers (the device image has both).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "vocab.json", "merges.txt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="a folder with tokenizer.json (and its config)")
    ap.add_argument("--seed", type=int, default=0, help="different seeds: different models of one shape")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.monotonic()
    tok_cfg = json.loads((a.tokenizer / "tokenizer.json").read_text())
    ids = list(tok_cfg["model"]["vocab"].values()) + [t["id"] for t in tok_cfg.get("added_tokens") or []]
    vocab = max(ids) + 1  # every id the tokenizer can produce has a row
    src_cfg = json.loads((a.tokenizer / "config.json").read_text()) if (a.tokenizer / "config.json").exists() else {}
    vocab = max(vocab, int(src_cfg.get("vocab_size") or 0))
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=a.context,
                      rope_theta=500000.0, tie_word_embeddings=False, torch_dtype=a.dtype,
                      bos_token_id=src_cfg.get("bos_token_id"), eos_token_id=src_cfg.get("eos_token_id"))
    torch.manual_seed(a.seed)
    dtype = getattr(torch, a.dtype)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(dtype)  # random init on the GPU when there is one: seconds, not minutes
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (a.tokenizer / name).exists():
            shutil.copy(a.tokenizer / name, a.out / name)
    size = sum(p.stat().st_size for p in a.out.glob("*.safetensors"))
    print(f"wrote {a.out}: {a.layers} layers, hidden {a.hidden}, vocab {vocab}, {a.dtype}, seed {a.seed}: "
          f"{size / 2**30:.2f} GiB of weights in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
