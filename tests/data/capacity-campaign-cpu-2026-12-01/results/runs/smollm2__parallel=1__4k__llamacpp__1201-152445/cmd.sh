#!/bin/sh
# servedeck 0.1.0: launch of smollm2@parallel=1 (llamacpp, build llamacpp) at 2026-12-01T15:24:36+00:00
# from /tmp/capcamp-new/capacity-campaign0/models.toml; secret values are redacted: set them in your environment before re-running
exec /root/.cache/servedeck/engines/llama.cpp-11434.0.0-cpu/bin/llama-server \
  -m /root/.cache/servedeck/models/smollm2-135m-instruct-q4_1.gguf \
  --host 127.0.0.1 \
  --port 19216 \
  --alias smollm2 \
  -c 4096 \
  --metrics \
  --log-verbosity 4 \
  --parallel 1
