#!/bin/sh
# servedeck 0.1.0: launch of r8b@cache-ram0 (llamacpp, build llamacpp-cuda) at 2026-12-01T09:48:36+00:00
# from /tmp/gpu-cache-ram.XZk3eP/models.toml; secret values are redacted: set them in your environment before re-running
export CUDA_VISIBLE_DEVICES=0
exec /tmp/gpu-cache-ram.XZk3eP/build/bin/llama-server \
  -m /tmp/gpu-cache-ram.XZk3eP/random-llama3-8b-f16.gguf \
  --host 127.0.0.1 \
  --port 8102 \
  --alias r8b \
  -c 131072 \
  --metrics \
  --n-gpu-layers 999 \
  --parallel 32 \
  --cache-ram 0
