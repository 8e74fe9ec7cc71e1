"""Writes a random-weight Llama model in Hugging Face layout (bf16 safetensors) that vLLM can serve.

Usage: python make-random-hf.py OUT_DIR --tokenizer-from DIR [--seed 0] [--layers 32 --hidden 4096 --heads 32
       --kv-heads 8 --ffn 14336 --context 8192] [--device cuda]

Defaults are Llama-3-8B's shape with SmolLM2's vocabulary (49,152 tokens, so SmolLM2's tokenizer files serve
it): 7.4 B parameters, 13.8 GiB. Its answers are noise: figures from it are speeds and memory, never answers
(a gate fails on it, as it must). Why random: no hub is reachable on the device and 15 GB of real weights do
not fit through its calls. Made on the GPU when there is one (about 20 s), the tensors filled by torch's own
initialisation. Greedy answers of such a model are still deterministic, so "identical after a wake" is a real
check. OUT_DIR/.complete marks a finished folder; one that has it is left as it is.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--tokenizer-from", type=Path, required=True)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--device", default=None, help="where the tensors are made (default: cuda when available)")
    p.add_argument("--seed", type=int, default=0, help="different seeds: different models of one shape")
    args = p.parse_args()
    if (args.out / ".complete").is_file():
        return
    if not (args.tokenizer_from / "tokenizer.json").is_file():
        sys.exit(f"make-random-hf: no tokenizer.json in {args.tokenizer_from}")

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=args.context,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.config.dtype = torch.bfloat16
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=args.out.name + ".tmp.", dir=args.out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size="5GB")
        GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(tmp)
        for f in TOKENIZER_FILES:
            if (args.tokenizer_from / f).is_file():
                shutil.copy(args.tokenizer_from / f, tmp / f)
        n = sum(t.numel() for t in model.parameters())
        (tmp / ".complete").write_text(f"random weights, {n} parameters, seed {args.seed}\n")
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors writes 0600
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if args.out.exists():
            shutil.rmtree(args.out)
        tmp.rename(args.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"make-random-hf: wrote {args.out} ({n / 1e9:.2f} B parameters, {device})", file=sys.stderr)


if __name__ == "__main__":
    main()
