#!/usr/bin/env bash
# Issue 12's GPU check: `servedeck serve` on a GPU host starts a CUDA llama-server on demand and its
# /metrics carries per-GPU memory and power from NVML; a second model whose memory does not fit gets 503
# naming the holder. Run in the repo root on an H200 host:
#   OUT=/some/dir LLAMA_SERVER=/path/to/cuda/llama-server [GGUF=/path/model.gguf] scripts/door-gpu-proof.sh
# Needs servedeck's Python deps (aiohttp, prometheus-client, pynvml, ...) importable, as scripts/gpu-proof.sh.
# Without GGUF, a random-weight GGUF is written by scripts/make-tiny-gguf.py (needs the `gguf` package).
# Not run on a GPU in this session (no device calls from helpers): expect to adjust once.
# Everything goes to $OUT/door-proof.log; the /metrics scrape to $OUT/metrics.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/door-gpu-proof-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/door-proof.log") 2>&1
work=$(mktemp -d /tmp/door-proof.XXXXXX)
export SERVEDECK_HOME=$work/home SERVEDECK_CONFIG=$work/models.toml PYTHONUNBUFFERED=1
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
sd() { "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' "$@"; }
door_pid=""
cleanup() { [ -n "$door_pid" ] && kill -TERM -- "-$door_pid" 2>/dev/null; sleep 2; sd stop --all --grace 10 >/dev/null 2>&1 || true; }
trap cleanup EXIT

nvidia-smi -L || { echo "not a GPU host"; exit 2; }
[ -x "${LLAMA_SERVER:-}" ] || { echo "set LLAMA_SERVER to a CUDA llama-server"; exit 2; }
gguf=${GGUF:-$work/tiny.gguf}
[ -f "$gguf" ] || "$py" "$repo/scripts/make-tiny-gguf.py" "$gguf" --layers 8 --hidden 1024 || exit 2
cat >"$SERVEDECK_CONFIG" <<EOF
[host]
min_residency_s = 0
[builds.cuda]
engine = "llamacpp"
binary = "$LLAMA_SERVER"
[models.small]
source = "$gguf"
build = "cuda"
port = 18181
slot = "a"
context = 4096
args = { n-gpu-layers = 999 }
[models.huge]
source = "$gguf"
build = "cuda"
port = 18182
slot = "b"
context = 8000000  # the planner's KV need (~32 KiB/token for the tiny GGUF) exceeds an H200
args = { n-gpu-layers = 999 }
EOF
sd render small
setsid "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' serve --port 18100 &
door_pid=$!
for _ in $(seq 100); do curl -sf localhost:18100/v1/models >/dev/null && break; sleep 0.2; done
echo "== a request for the stopped model starts it"
curl -sS localhost:18100/v1/completions -d '{"model": "small", "prompt": "hi", "max_tokens": 8}'; echo
echo "== /metrics (GPU rows)"
curl -sS localhost:18100/metrics >"$OUT/metrics.txt"
grep -E "^servedeck_gpu_|servedeck_door_requests_total" "$OUT/metrics.txt"
echo "== a model that cannot fit: 503 naming the holder"
curl -sS -i localhost:18100/v1/completions -d '{"model": "huge", "prompt": "hi", "max_tokens": 8}'; echo
nvidia-smi --query-gpu=index,memory.used,power.draw --format=csv,noheader
echo "done: $OUT"
