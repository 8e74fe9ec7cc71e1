#!/bin/sh
# servedeck 0.1.0: launch of m1 (vllm, build vllm) at 2026-12-03T08:45:20+00:00
# from /tmp/sleep-switch-74n60xtt/models-sleep.toml; secret values are redacted: set them in your environment before re-running
export PYTHONPATH=/tmp/site
export VLLM_USE_FLASHINFER_SAMPLER=0
export VLLM_SERVER_DEV_MODE=1
export CUDA_VISIBLE_DEVICES=0
exec /opt/torch/.venv/bin/python3 \
  -m vllm.entrypoints.openai.api_server \
  --model /tmp/vllm-models/r8b \
  --served-model-name m1 \
  --host 127.0.0.1 \
  --port 8201 \
  --max-model-len 8192 \
  --gpu-memory-utilization 0.9 \
  --max-num-seqs 256 \
  --enable-sleep-mode \
  --enable-prompt-tokens-details
