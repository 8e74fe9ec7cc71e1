#!/bin/sh
# servedeck 0.1.0: launch of r8b (vllm, build vllm-cuda) at 2026-12-03T08:38:45+00:00
# from /tmp/gpu-vllm/models.toml; secret values are redacted: set them in your environment before re-running
export PYTHONPATH=/tmp/site
export VLLM_USE_FLASHINFER_SAMPLER=0
export HF_HUB_OFFLINE=1
export CUDA_VISIBLE_DEVICES=0
exec /opt/torch/.venv/bin/python3 \
  -m vllm.entrypoints.openai.api_server \
  --model /tmp/vllm-models/r8b \
  --served-model-name r8b \
  --host 127.0.0.1 \
  --port 8100 \
  --max-model-len 8192 \
  --gpu-memory-utilization 0.9 \
  --max-num-seqs 256 \
  --enable-prompt-tokens-details
